"""The core's durable state in SQLite: workloads, placements, cordons and the decision journal.

Placement is a two-step, crash-safe protocol keyed by workload UID:

1. ``plan``: the engine's assignments are written as ``planned`` in one
   transaction, with a journal entry each.
2. ``mark_applied``: after the actuator did its (idempotent) work for one
   workload, its row moves ``planned -> placed`` and the journal records
   ``apply`` — in one transaction, guarded by the row's state, so an ``apply``
   can be recorded at most once per placement.

A core killed between the two finds its ``planned`` rows on start and applies
them again; because the actuators are idempotent per UID, nothing is lost and
nothing is applied twice.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloud_core.errors import CoreError


class StoreError(CoreError):
    """The core's database could not be opened or written."""


@dataclass(frozen=True, slots=True)
class WorkloadRow:
    uid: str
    name: str
    namespace: str
    spec: dict[str, Any]
    state: str  # pending | planned | placed | unplaceable | deleted
    node: str | None
    reason: str
    created: float
    updated: float


@dataclass(frozen=True, slots=True)
class JournalEntry:
    id: int
    ts: float
    uid: str
    action: str  # submit | plan | apply | fail | move | delete | cordon | uncordon
    node: str | None
    detail: str


_SCHEMA = """
CREATE TABLE IF NOT EXISTS workloads (
  uid TEXT PRIMARY KEY, name TEXT NOT NULL, namespace TEXT NOT NULL, spec TEXT NOT NULL,
  state TEXT NOT NULL, node TEXT, reason TEXT NOT NULL DEFAULT '',
  created REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS workloads_state ON workloads(state);
CREATE TABLE IF NOT EXISTS journal (
  id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, uid TEXT NOT NULL,
  action TEXT NOT NULL, node TEXT, detail TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS journal_uid ON journal(uid);
CREATE TABLE IF NOT EXISTS cordons (node TEXT PRIMARY KEY, ts REAL NOT NULL, by TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS audit (
  id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, operator TEXT NOT NULL,
  cmd TEXT NOT NULL, args TEXT NOT NULL, result TEXT NOT NULL);
"""


class Store:
    def __init__(self, path: Path | str, clock: Any = time.time) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        try:
            if str(path) != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: a placement acknowledged to the operator survives power loss.
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open core database {path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ helpers

    def _tx(self, fn: Any) -> Any:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                out = fn()
                self._db.execute("COMMIT")
                return out
            except sqlite3.Error as exc:
                self._db.execute("ROLLBACK")
                raise StoreError(f"database write failed: {exc}") from exc
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _journal(self, uid: str, action: str, node: str | None, detail: str = "") -> None:
        self._db.execute(
            "INSERT INTO journal (ts, uid, action, node, detail) VALUES (?,?,?,?,?)",
            (self._clock(), uid, action, node, detail[:2000]),
        )

    @staticmethod
    def _row(r: tuple[Any, ...]) -> WorkloadRow:
        return WorkloadRow(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7], r[8])

    # ------------------------------------------------------------------ workloads

    def submit(self, uid: str, name: str, namespace: str, spec: dict[str, Any]) -> bool:
        """Add a workload as pending; False if that UID already exists (idempotent submit)."""
        now = self._clock()

        def tx() -> bool:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO workloads VALUES (?,?,?,?,?,?,?,?,?)",
                (uid, name, namespace, json.dumps(spec), "pending", None, "", now, now),
            )
            if cur.rowcount:
                self._journal(uid, "submit", None, f"{namespace}/{name}")
            return bool(cur.rowcount)

        return bool(self._tx(tx))

    def delete(self, uid: str) -> WorkloadRow | None:
        def tx() -> WorkloadRow | None:
            row = self.get(uid)
            if row is None or row.state == "deleted":
                return None
            self._db.execute(
                "UPDATE workloads SET state='deleted', updated=? WHERE uid=?", (self._clock(), uid)
            )
            self._journal(uid, "delete", row.node)
            return row

        out: WorkloadRow | None = self._tx(tx)
        return out

    def get(self, uid: str) -> WorkloadRow | None:
        with self._lock:
            r = self._db.execute("SELECT * FROM workloads WHERE uid=?", (uid,)).fetchone()
        return self._row(r) if r else None

    def find(self, name: str, namespace: str | None = None) -> list[WorkloadRow]:
        q = "SELECT * FROM workloads WHERE (uid=? OR name=?) AND state != 'deleted'"
        args: list[Any] = [name, name]
        if namespace:
            q += " AND namespace=?"
            args.append(namespace)
        with self._lock:
            return [self._row(r) for r in self._db.execute(q, args).fetchall()]

    def workloads(self, states: tuple[str, ...] | None = None) -> list[WorkloadRow]:
        with self._lock:
            if states:
                marks = ",".join("?" * len(states))
                rows = self._db.execute(
                    f"SELECT * FROM workloads WHERE state IN ({marks}) ORDER BY created, uid",
                    states,
                ).fetchall()
            else:
                rows = self._db.execute(
                    "SELECT * FROM workloads WHERE state != 'deleted' ORDER BY created, uid"
                ).fetchall()
        return [self._row(r) for r in rows]

    def placements(self) -> dict[str, list[str]]:
        """node -> UIDs placed (or planned) there."""
        out: dict[str, list[str]] = {}
        for w in self.workloads(("planned", "placed")):
            if w.node:
                out.setdefault(w.node, []).append(w.uid)
        return out

    # ------------------------------------------------------------------ placing

    def plan(self, assignments: dict[str, str], detail: dict[str, str] | None = None) -> int:
        """Record the engine's decisions for pending workloads as planned."""
        detail = detail or {}

        def tx() -> int:
            n = 0
            now = self._clock()
            for uid, node in assignments.items():
                cur = self._db.execute(
                    "UPDATE workloads SET state='planned', node=?, reason='', updated=?"
                    " WHERE uid=? AND state IN ('pending', 'unplaceable')",
                    (node, now, uid),
                )
                if cur.rowcount:
                    self._journal(uid, "plan", node, detail.get(uid, ""))
                    n += 1
            return n

        return int(self._tx(tx))

    def mark_applied(self, uid: str, node: str) -> bool:
        """planned -> placed, journalled once; False if it was not planned (already applied)."""

        def tx() -> bool:
            cur = self._db.execute(
                "UPDATE workloads SET state='placed', updated=? WHERE uid=? AND state='planned'"
                " AND node=?",
                (self._clock(), uid, node),
            )
            if cur.rowcount:
                self._journal(uid, "apply", node)
            return bool(cur.rowcount)

        return bool(self._tx(tx))

    def mark_unplaceable(self, reasons: dict[str, str]) -> None:
        def tx() -> None:
            now = self._clock()
            for uid, reason in reasons.items():
                cur = self._db.execute(
                    "UPDATE workloads SET state='unplaceable', reason=?, updated=?"
                    " WHERE uid=? AND state IN ('pending', 'unplaceable') AND reason != ?",
                    (reason, now, uid, reason),
                )
                if cur.rowcount:
                    self._journal(uid, "fail", None, reason)

        self._tx(tx)

    def move(self, uid: str, src: str, dst: str, reason: str) -> bool:
        """A placed workload re-planned onto ``dst``; it is applied like a new plan."""

        def tx() -> bool:
            cur = self._db.execute(
                "UPDATE workloads SET state='planned', node=?, updated=? WHERE uid=? AND node=?"
                " AND state IN ('placed', 'planned')",
                (dst, self._clock(), uid, src),
            )
            if cur.rowcount:
                self._journal(uid, "move", dst, f"from {src}: {reason}")
            return bool(cur.rowcount)

        return bool(self._tx(tx))

    def requeue(self, uid: str, reason: str) -> bool:
        """Send a placed workload back to pending (its node is gone and nothing else fits now)."""

        def tx() -> bool:
            row = self.get(uid)
            cur = self._db.execute(
                "UPDATE workloads SET state='pending', node=NULL, reason=?, updated=? WHERE uid=?"
                " AND state IN ('placed', 'planned')",
                (reason, self._clock(), uid),
            )
            if cur.rowcount:
                self._journal(uid, "requeue", row.node if row else None, reason)
            return bool(cur.rowcount)

        return bool(self._tx(tx))

    # ------------------------------------------------------------------ cordons

    def cordon(self, node: str, by: str) -> bool:
        def tx() -> bool:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO cordons VALUES (?,?,?)", (node, self._clock(), by)
            )
            if cur.rowcount:
                self._journal("-", "cordon", node, by)
            return bool(cur.rowcount)

        return bool(self._tx(tx))

    def uncordon(self, node: str, by: str) -> bool:
        def tx() -> bool:
            cur = self._db.execute("DELETE FROM cordons WHERE node=?", (node,))
            if cur.rowcount:
                self._journal("-", "uncordon", node, by)
            return bool(cur.rowcount)

        return bool(self._tx(tx))

    def cordoned(self) -> set[str]:
        with self._lock:
            return {r[0] for r in self._db.execute("SELECT node FROM cordons").fetchall()}

    # ------------------------------------------------------------------ journal

    def journal(self, uid: str | None = None, limit: int = 1000) -> list[JournalEntry]:
        with self._lock:
            if uid is None:
                rows = self._db.execute(
                    "SELECT * FROM journal ORDER BY id DESC LIMIT ?", (limit,)
                ).fetchall()
            else:
                rows = self._db.execute(
                    "SELECT * FROM journal WHERE uid=? ORDER BY id DESC LIMIT ?", (uid, limit)
                ).fetchall()
        return [JournalEntry(*r) for r in reversed(rows)]

    def apply_counts(self) -> dict[str, int]:
        """UID -> number of `apply` journal entries (a placement applied twice shows as 2)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT uid, COUNT(*) FROM journal WHERE action='apply' GROUP BY uid"
            ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    # ------------------------------------------------------------------ audit

    def audit(
        self, ts: float, operator: str, cmd: str, args: dict[str, Any], result: str, _: str = ""
    ) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO audit (ts, operator, cmd, args, result) VALUES (?,?,?,?,?)",
                (ts, operator[:64], cmd[:64], audit_json(args), result[:2000]),
            )

    def audit_log(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest ``limit`` entries, oldest first; an entry written before arguments
        were kept as valid JSON shows its text under ``{"unreadable": ...}``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT ts, operator, cmd, args, result FROM audit ORDER BY id DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            {"ts": r[0], "operator": r[1], "cmd": r[2], "args": _audit_args(r[3]),
             "result": r[4]}
            for r in reversed(rows)
        ]


AUDIT_ARGS_MAX = 4000  # characters of JSON per entry
_AUDIT_STR = 200  # characters kept of one string value
_AUDIT_ITEMS = 20  # items kept of one list or object
_AUDIT_DEPTH = 6


def _shrink(o: Any, depth: int, s_max: int, n_max: int) -> Any:
    """A JSON-able copy of ``o`` with long strings, long lists and deep nesting cut, each
    cut marked, so what is stored is always valid JSON (truncate values, not encoding)."""
    if isinstance(o, str):
        return o if len(o) <= s_max else o[:s_max] + f"...(+{len(o) - s_max} chars)"
    if isinstance(o, bool) or o is None:
        return o
    if isinstance(o, int):
        return o if abs(o) < 10**30 else "(a huge integer)"
    if isinstance(o, float):
        return o if math.isfinite(o) else str(o)
    if depth <= 0:
        return "...(nested)"
    if isinstance(o, dict):
        items = list(o.items())
        out = {str(k)[:s_max]: _shrink(v, depth - 1, s_max, n_max) for k, v in items[:n_max]}
        if len(items) > n_max:
            out["..."] = f"+{len(items) - n_max} keys"
        return out
    if isinstance(o, list | tuple):
        kept = [_shrink(v, depth - 1, s_max, n_max) for v in o[:n_max]]
        if len(o) > n_max:
            kept.append(f"...(+{len(o) - n_max} items)")
        return kept
    return _shrink(str(o), depth, s_max, n_max)


def audit_json(args: Any) -> str:
    """``args`` as JSON of at most ``AUDIT_ARGS_MAX`` characters, always valid: values are
    cut, ever harder, until it fits."""
    s_max, n_max = _AUDIT_STR, _AUDIT_ITEMS
    while True:
        out = json.dumps(_shrink(args, _AUDIT_DEPTH, s_max, n_max), allow_nan=False)
        if len(out) <= AUDIT_ARGS_MAX or (s_max <= 8 and n_max <= 1):
            break
        s_max, n_max = max(8, s_max // 2), max(1, n_max // 2)
    if len(out) > AUDIT_ARGS_MAX:
        out = json.dumps({"...": f"arguments of {len(out)} characters not kept"})
    return out


def _audit_args(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {"unreadable": text}
