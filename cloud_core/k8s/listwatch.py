"""Reading collections from the Kubernetes API server: list pages and watch streams.

``list_pages`` follows a list's ``continue`` tokens and yields each page as it arrives;
``watch`` streams one event per line over a connection of its own. Both take a ``Schema``
(``objects.POD``, ``objects.NODE``) that keeps only what cfnet reads of a kind.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from cloud_core.errors import KubeUnavailable
from cloud_core.k8s.objects import Schema
from cloud_core.k8s.transport import (
    JSON,
    LeanHTTP,
    api_error,
    decode_json,
    encode_json,
    query_string,
)

Page = tuple[list[JSON], str]  # one page of a list: its items, the list's resourceVersion

# A watch line is one object (etcd stores at most 1.5 MiB an object; JSON adds little).
WATCH_LINE_MAX_BYTES = 16 << 20


def list_pages(lean: LeanHTTP, path: str, *, limit: int, schema: Schema | None,
               query: Mapping[str, Any]) -> Iterator[Page]:
    """The pages of one list, as they arrive: ``(items, resourceVersion)``
    (``KubeClient.list_pages``)."""
    cont: str | None = None
    decoder = decode_json if schema is None else schema.page
    while True:
        q = query_string({"limit": limit, "continue": cont, **query})
        page = lean.request("GET", f"{path}?{q}", decoder=decoder)
        meta = page.get("metadata") or {}
        cont = meta.get("continue")
        yield [*(page.get("items") or [])], str(meta.get("resourceVersion", ""))
        if not cont:
            return


def watch(lean: LeanHTTP, path: str, resource_version: str, *, timeout_s: int,
          stop: threading.Event | None, schema: Schema | None,
          query: Mapping[str, Any]) -> Iterator[tuple[str, JSON]]:
    """Stream ``(type, object)`` from ``resource_version`` until the server ends the watch
    (``KubeClient.watch``)."""
    decode = decode_json if schema is None else schema.event
    q = query_string({"watch": True, "resourceVersion": resource_version,
                      "allowWatchBookmarks": True, "timeoutSeconds": timeout_s, **query})
    what = f"WATCH {path}"
    c = lean.connect(timeout_s + 15.0)  # the server ends it at timeout_s
    try:
        try:
            c.request("GET", f"{lean.prefix}{path}?{q}", headers=lean.headers(False))
            resp = c.getresponse()
            if not 200 <= resp.status <= 299:
                raise api_error(resp.status, resp.read(), what)
        except (OSError, http.client.HTTPException) as e:
            raise KubeUnavailable(f"{what}: {type(e).__name__}: {e}") from e
        buf = b""
        while True:
            try:
                chunk = resp.read1(65536)
            except (OSError, http.client.HTTPException) as e:
                raise KubeUnavailable(f"{what}: stream broke: {e}") from e
            if not chunk:
                return
            if stop is not None and stop.is_set():
                return
            buf += chunk
            if b"\n" not in chunk:
                if len(buf) > WATCH_LINE_MAX_BYTES:
                    raise KubeUnavailable(f"{what}: an event over {WATCH_LINE_MAX_BYTES} "
                                          "bytes")
                continue
            *lines, buf = buf.split(b"\n")  # one split a chunk, not one a line
            for line in lines:
                if not line.strip():
                    continue
                try:
                    ev = decode(line)
                except msgspec.DecodeError as e:
                    raise KubeUnavailable(f"{what}: not a JSON event: {e}") from e
                kind, obj = str(ev.get("type")), ev.get("object") or {}
                if kind == "ERROR":
                    raise api_error(int(obj.get("code") or 500), encode_json(obj), what)
                yield kind, obj
    finally:
        c.close()
