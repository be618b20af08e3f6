"""Planned moves kept on the leader's Lease, so that a new leader finishes them.

A move evicts a pod and reserves its destination for the replacement its controller creates
(``moves.py``). That reservation lived only in the leader's memory: a leader that died between
the eviction and the replacement's binding took it along, and its successor placed the
replacement afresh. Now the leader writes the reservation into the annotation
``cfnet.io/planned-moves`` of the Lease it holds (``leader.py``) *before* it evicts, drops it
when the replacement is bound (or it expires), and a new leader reads it back when it takes the
Lease (one GET of an object it reads anyway).

Why the Lease (docs/kubernetes.md, "State a new leader can read"): it is written before the
replacement exists, which ``status.nominatedNodeName`` on the replacement cannot be (the window
eviction -> replacement created would stay in memory); it needs no permission beyond the
``get``/``update`` of that one Lease the core already has, where an annotation on the owning
ReplicaSet/StatefulSet/Job would need ``patch`` on every workload controller of the cluster;
and each write carries the Lease's resourceVersion and checks the holder, so a deposed leader's
write is refused and it evicts nothing (a fence, like the UID-preconditioned bindings).

The annotation is cfnet's own (only the core's account may update that Lease) but is read
defensively: bounded in size and entries, malformed entries dropped with a warning.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from cloud_core.errors import KubeConflict, KubeError
from cloud_core.k8s.client import KubeClient

log = logging.getLogger(__name__)

ANNOTATION = "cfnet.io/planned-moves"
MAX_ENTRIES = 500  # ~120 bytes each: well inside the 256 KiB the API allows for annotations
MAX_BYTES = 128 * 1024
WRITE_TRIES = 3  # a conflict with the elector's own renewal is retried on a fresh read

# (replacement key, node, moved pod uid, expiry as wall-clock seconds)
Entry = tuple[tuple[str, ...], str, str, float]


class LedgerError(KubeError):
    """The ledger could not be written (not the holder, or the API server refused)."""


def encode(entries: list[Entry]) -> str:
    return json.dumps([[list(k), n, u, round(e, 3)] for k, n, u, e in entries],
                      separators=(",", ":"))


def decode(raw: str | None) -> list[Entry]:
    """Entries of the annotation; what is malformed or oversized is dropped (warned)."""
    if not raw:
        return []
    if len(raw) > MAX_BYTES:
        log.warning("%s is %d bytes (> %d): ignored", ANNOTATION, len(raw), MAX_BYTES)
        return []
    try:
        items = json.loads(raw)
    except ValueError as e:
        log.warning("%s is not JSON (%s): ignored", ANNOTATION, e)
        return []
    out: list[Entry] = []
    for it in items[:MAX_ENTRIES] if isinstance(items, list) else []:
        ok = (isinstance(it, list) and len(it) == 4 and isinstance(it[0], list)
              and 0 < len(it[0]) <= 4 and all(isinstance(s, str) and len(s) <= 253
                                               for s in (*it[0], it[1], it[2]))
              and isinstance(it[3], int | float) and not isinstance(it[3], bool))
        if not ok:
            log.warning("%s: malformed entry %.200r dropped", ANNOTATION, it)
            continue
        out.append((tuple(it[0]), it[1], it[2], float(it[3])))
    return out


class MoveLedger:
    """Reads and writes the planned moves on Lease ``namespace/name`` held by ``identity``."""

    def __init__(self, client: KubeClient, namespace: str, name: str, identity: str) -> None:
        self.client = client
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.identity = identity

    def read(self) -> list[Entry]:
        """The planned moves not yet expired (raises KubeError: the caller retries)."""
        lease = self.client.get(self.path)
        now = time.time()
        ann = (lease.get("metadata") or {}).get("annotations") or {}
        return [e for e in decode(ann.get(ANNOTATION)) if e[3] > now]

    def write(self, entries: list[Entry]) -> None:
        """Replace the planned moves, as the Lease's holder only (LedgerError otherwise)."""
        if len(entries) > MAX_ENTRIES:
            raise LedgerError(f"{len(entries)} planned moves, more than {MAX_ENTRIES}")
        value = encode(entries)
        for _ in range(WRITE_TRIES):
            lease: dict[str, Any] = self.client.get(self.path)
            holder = (lease.get("spec") or {}).get("holderIdentity")
            if holder != self.identity:
                raise LedgerError(f"the Lease is held by {holder!r}, not {self.identity!r}")
            md = lease.setdefault("metadata", {})
            anns = md.setdefault("annotations", {})
            if not entries and ANNOTATION not in anns:
                return
            if anns.get(ANNOTATION) == value:
                return
            if entries:
                anns[ANNOTATION] = value
            else:
                anns.pop(ANNOTATION, None)
            try:
                self.client.replace(self.path, lease)  # carries the resourceVersion read
                return
            except KubeConflict:
                continue  # the elector renewed meanwhile: read again
            except KubeError as e:
                raise LedgerError(f"writing {ANNOTATION} failed: {e}") from e
        raise LedgerError(f"writing {ANNOTATION}: {WRITE_TRIES} conflicts in a row")
