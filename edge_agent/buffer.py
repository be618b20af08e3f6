"""Persistent store-and-forward buffer for telemetry (SQLite), bounded by bytes and age.

Every report goes through here: it is written before it is published and
deleted only once the *core* acknowledged it (``cfnet/v1/nodes/{node}/ack``,
after ingest), not when the broker did, so a broker outage, a cut link, a core
that is down or SIGKILLed, or an agent restart loses nothing that fits the
bounds: this buffer is the only store of unacknowledged reports. When the buffer is full it
thins the oldest half (keeps every k-th report) instead of refusing new ones:
a coarser history of an outage is worth more than none of its end. Everything
thinned or expired is counted, persistently, and reported upstream.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from edge_agent.errors import AgentError


class ReportBufferError(AgentError):
    """The buffer's database could not be opened or written."""


@dataclass(frozen=True, slots=True)
class Pending:
    """One buffered report: its row id, sequence number, encoded payload and boot."""
    id: int
    seq: int
    payload: bytes
    boot: str = ""


class ReportBuffer:
    def __init__(
        self,
        path: Path | str,
        *,
        max_bytes: int = 16 * 1024 * 1024,
        max_age_s: float = 7 * 86400.0,
        keep_every: int = 2,
    ) -> None:
        if keep_every < 2:
            raise ValueError("keep_every must be >= 2, or thinning would free nothing")
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.keep_every = keep_every
        self._lock = threading.Lock()
        try:
            if str(path) != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            # Keep the write-ahead log in proportion to the bound: by default
            # SQLite lets it reach 1000 pages (~4 MiB) and never shrinks it, so a
            # 32 KiB buffer took 4 MiB of disk. Checkpoint after about max_bytes
            # of log (16..1000 pages) and truncate the log file back to that.
            page = int(self._db.execute("PRAGMA page_size").fetchone()[0])
            wal_pages = max(16, min(1000, max_bytes // page))
            self._db.execute(f"PRAGMA wal_autocheckpoint={wal_pages}")
            self._db.execute(f"PRAGMA journal_size_limit={wal_pages * page}")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS reports (id INTEGER PRIMARY KEY AUTOINCREMENT,"
                " seq INTEGER NOT NULL, ts REAL NOT NULL, size INTEGER NOT NULL,"
                " payload BLOB NOT NULL)"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL)"
            )
            # Reports buffered before acks were end to end have no boot column:
            # add it and fill it from each report's own "boot", so the core's
            # ack (by boot and seq) finds them.
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(reports)")}
            if "boot" not in cols:
                self._db.execute("ALTER TABLE reports ADD COLUMN boot TEXT NOT NULL DEFAULT ''")
                # Without JSON1 they go out, are given up after max_tries, counted.
                with contextlib.suppress(sqlite3.OperationalError):
                    self._db.execute(
                        "UPDATE reports SET boot = COALESCE(json_extract(CAST(payload AS TEXT),"
                        " '$.boot'), '') WHERE json_valid(CAST(payload AS TEXT))")
            self._db.execute("CREATE INDEX IF NOT EXISTS reports_boot_seq ON reports (boot, seq)")
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('thinned', 0), ('expired', 0),"
                             " ('refused', 0)")
        except sqlite3.Error as exc:
            raise ReportBufferError(f"cannot open report buffer at {path}: {exc}") from exc

    # ------------------------------------------------------------------ counters

    def _meta(self, key: str) -> int:
        row = self._db.execute("SELECT v FROM meta WHERE k=?", (key,)).fetchone()
        return int(row[0]) if row else 0

    @property
    def thinned(self) -> int:
        with self._lock:
            return self._meta("thinned")

    @property
    def expired(self) -> int:
        with self._lock:
            return self._meta("expired")

    @property
    def refused(self) -> int:
        """Reports given up after the core, acknowledging others, never acknowledged them."""
        with self._lock:
            return self._meta("refused")

    @property
    def dropped(self) -> int:
        """Reports lost for good (thinned + expired + refused), since this buffer was created."""
        with self._lock:
            # One query, not three: the sampler reads this for every report.
            row = self._db.execute("SELECT COALESCE(SUM(v),0) FROM meta WHERE k IN "
                                   "('thinned','expired','refused')").fetchone()
            return int(row[0])

    def depth(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM reports").fetchone()[0])

    def size_bytes(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(SUM(size),0) FROM reports").fetchone()[0])

    # ------------------------------------------------------------------ queue

    def put(self, seq: int, ts: float, payload: bytes, boot: str = "") -> None:
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute(
                    "INSERT INTO reports (seq, ts, size, payload, boot) VALUES (?,?,?,?,?)",
                    (seq, ts, len(payload), payload, boot),
                )
                self._expire(ts)
                self._thin()
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise ReportBufferError(f"cannot buffer report {seq}: {exc}") from exc

    def peek(self, limit: int) -> list[Pending]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, seq, payload, boot FROM reports ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        return [Pending(int(r[0]), int(r[1]), bytes(r[2]), str(r[3])) for r in rows]

    def ack(self, ids: list[int]) -> None:
        """Delete these rows (the core has them)."""
        if not ids:
            return
        with self._lock:
            self._db.executemany("DELETE FROM reports WHERE id=?", [(i,) for i in ids])

    def ack_seqs(self, boot: str, ranges: tuple[tuple[int, int], ...]) -> list[int]:
        """Delete the reports of ``boot`` whose seq is in one of the inclusive ``ranges``;
        returns the row ids deleted."""
        if not ranges:
            return []
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                ids: list[int] = []
                for lo, hi in ranges:
                    ids.extend(int(r[0]) for r in self._db.execute(
                        "SELECT id FROM reports WHERE boot=? AND seq BETWEEN ? AND ?",
                        (boot, lo, hi)))
                self._db.executemany("DELETE FROM reports WHERE id=?", [(i,) for i in ids])
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise ReportBufferError(f"cannot apply ack for boot {boot}: {exc}") from exc
        return ids

    def give_up(self, ids: list[int]) -> None:
        """Delete reports the core keeps refusing; counted as ``refused`` (and dropped)."""
        if not ids:
            return
        with self._lock:
            cur = self._db.executemany("DELETE FROM reports WHERE id=?", [(i,) for i in ids])
            self._db.execute("UPDATE meta SET v = v + ? WHERE k='refused'", (cur.rowcount,))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ bounds

    def _rollback(self) -> None:
        try:
            with self._lock:
                self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def _expire(self, now: float) -> None:
        cur = self._db.execute("DELETE FROM reports WHERE ts < ?", (now - self.max_age_s,))
        if cur.rowcount > 0:
            self._db.execute("UPDATE meta SET v = v + ? WHERE k='expired'", (cur.rowcount,))

    def _thin(self) -> None:
        """While over the byte bound, drop all but every k-th of the oldest half."""
        while True:
            total, count = self._db.execute(
                "SELECT COALESCE(SUM(size),0), COUNT(*) FROM reports"
            ).fetchone()
            if total <= self.max_bytes or count <= 1:
                return
            half = max(1, count // 2)
            ids = [
                r[0]
                for r in self._db.execute("SELECT id FROM reports ORDER BY id LIMIT ?", (half,))
            ]
            # Keep ids[0], ids[k], ids[2k], ...: the oldest stays, so the
            # history's start is never lost; a single row can always go.
            victims = [i for n, i in enumerate(ids) if n % self.keep_every != 0] or ids[:1]
            self._db.executemany("DELETE FROM reports WHERE id=?", [(i,) for i in victims])
            self._db.execute("UPDATE meta SET v = v + ? WHERE k='thinned'", (len(victims),))
