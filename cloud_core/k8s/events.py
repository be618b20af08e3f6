"""Kubernetes Events as kube-scheduler writes them, and the thread that writes them.

Events are ``events.k8s.io/v1`` (regarding, note, action, reportingController/Instance),
written by an ``EventRecorder`` thread, off the binding path, with kube's series aggregation
for repeats.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import UTC, datetime
from typing import Any

from cloud_core.errors import KubeError
from cloud_core.k8s.transport import JSON, MERGE_PATCH, LeanHTTP

log = logging.getLogger(__name__)


def micro_time(t: float | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    dt = datetime.fromtimestamp(time.time() if t is None else t, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_last_event_ns = [0]
_event_ns_lock = threading.Lock()


def _event_suffix() -> str:
    """An event name's suffix as client-go's events recorder makes it (``%x`` of the
    time in nanoseconds), strictly increasing within the process so that two events about
    one object in the same nanosecond still differ (uuid4 cost 2 % of the core's CPU in a
    burst: urandom and a UUID object per binding)."""
    with _event_ns_lock:
        ns = max(time.time_ns(), _last_event_ns[0] + 1)
        _last_event_ns[0] = ns
    return f"{ns:x}"


def event_body(involved: JSON, *, reason: str, message: str, event_type: str, action: str,
               controller: str, instance: str, t: float | None = None) -> JSON:
    """An ``events.k8s.io/v1`` Event about ``involved``, as kube-scheduler writes one."""
    md = involved.get("metadata") or {}
    ns = md.get("namespace") or "default"
    return {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": f"{md.get('name')}.{_event_suffix()}", "namespace": ns},
        "eventTime": micro_time(t), "type": event_type, "reason": reason,
        "action": action, "note": message[:1024],
        "reportingController": controller, "reportingInstance": instance or controller,
        "regarding": {"apiVersion": involved.get("apiVersion", "v1"),
                      "kind": involved.get("kind", "Pod"), "name": md.get("name"),
                      "namespace": md.get("namespace"), "uid": md.get("uid")},
    }


class EventRecorder:
    """Writes events from one background thread: never a blocking call on the caller's path.

    Like client-go's events broadcaster, an event equal to one written in the last
    ``series_window_s`` (same object, type, reason, action, note) is not written again: the
    first one's ``series`` (count, lastObservedTime) is patched, at most once per
    ``series_patch_s``. The queue is bounded; events that do not fit are dropped and counted
    (``stats["dropped"]``), so a flood cannot grow the core's memory.

    Events about the cluster rather than a pod being scheduled (a Node's label problems) go
    to a second, bounded lane (``background=True``): one thread writes them, at most
    ``background_per_s`` a second and only while the first lane is empty, so that 5,000
    Nodes read at start-up do not put 5,000 writes ahead of the first bindings' events.
    """

    def __init__(self, http_: LeanHTTP, *, max_queue: int = 20_000, workers: int = 4,
                 series_window_s: float = 360.0, series_patch_s: float = 5.0,
                 background_per_s: float = 20.0) -> None:
        self._http = http_
        self._q: queue.Queue[JSON | None] = queue.Queue(max_queue)
        self._bg: queue.Queue[JSON] = queue.Queue(max_queue)
        self.background_per_s = background_per_s
        self._hurry = threading.Event()  # set by flush(): the background lane is not paced
        self.series_window_s = series_window_s
        self.series_patch_s = series_patch_s
        # key -> [namespace, name, count, first seen, last patched count, last observed]
        self._seen: dict[tuple[Any, ...], list[Any]] = {}
        self.stats = {"written": 0, "series": 0, "dropped": 0, "failed": 0,
                      "background_dropped": 0}
        self.workers = workers
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def record(self, ev: JSON, background: bool = False) -> None:
        """Queue ``ev`` (never blocks; a full lane drops it and counts it)."""
        if not self._threads:
            with self._lock:
                while len(self._threads) < self.workers:  # a few writers: one would lag
                    t = threading.Thread(target=self._run, name="events", daemon=True)
                    t.start()
                    self._threads.append(t)
                t = threading.Thread(target=self._run_background, name="events-bg",
                                     daemon=True)
                t.start()
                self._threads.append(t)
        try:
            (self._bg if background else self._q).put_nowait(ev)
        except queue.Full:
            self.stats["background_dropped" if background else "dropped"] += 1

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event of both lanes has been written (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        self._hurry.set()
        try:
            while time.monotonic() < deadline:
                if self._q.unfinished_tasks == 0 and self._bg.unfinished_tasks == 0:
                    self._patch_series(force=True)
                    return True
                time.sleep(0.01)
            return False
        finally:
            self._hurry.clear()

    def close(self) -> None:
        if self._threads:
            self.flush(5.0)
            for _ in range(self.workers):
                self._q.put(None)
            self._bg.put({})  # the background writer's stop
            for t in self._threads:
                t.join(5.0)

    def _key(self, ev: JSON) -> tuple[Any, ...]:
        r = ev.get("regarding") or {}
        return (r.get("uid"), r.get("name"), ev.get("type"), ev.get("reason"),
                ev.get("action"), ev.get("note"))

    def _run(self) -> None:
        while True:
            try:
                ev = self._q.get(timeout=self.series_patch_s)
            except queue.Empty:
                self._patch_series(force=False)
                continue
            if ev is None:
                self._q.task_done()
                return
            try:
                self._write_or_count(ev)
            finally:
                self._q.task_done()

    def _write_or_count(self, ev: JSON) -> None:
        try:
            self._write(ev)
        except Exception:
            self.stats["failed"] += 1
            log.exception("event %s lost", ev.get("reason"))

    def _run_background(self) -> None:
        gap = 1.0 / self.background_per_s if self.background_per_s > 0 else 0.0
        while True:
            ev = self._bg.get()
            if not ev:
                self._bg.task_done()
                return
            # the pods' lane first: wait while it has work (bounded, so a lane that is never
            # empty in a long burst still lets these through, one a second)
            waited = 0.0
            while self._q.unfinished_tasks and waited < 1.0:
                time.sleep(0.02)
                waited += 0.02
            try:
                self._write_or_count(ev)
            finally:
                self._bg.task_done()
            if gap and not self._hurry.is_set():
                self._hurry.wait(gap)

    def _write(self, ev: JSON) -> None:
        now = time.monotonic()
        key = self._key(ev)
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[3] < self.series_window_s:
                seen[2] += 1
                seen[5] = ev.get("eventTime")
                self.stats["series"] += 1
                return
            if len(self._seen) > 50_000:  # bounded: forget the oldest half
                for k in sorted(self._seen, key=lambda k: self._seen[k][3])[:25_000]:
                    del self._seen[k]
        md = ev["metadata"]
        try:
            self._http.request("POST", f"/apis/events.k8s.io/v1/namespaces/{md['namespace']}"
                                       "/events", ev, decode=False)
            self.stats["written"] += 1
        except KubeError as e:
            self.stats["failed"] += 1
            log.warning("event %s for %s lost: %s", ev.get("reason"),
                        (ev.get("regarding") or {}).get("name"), e)
            return
        with self._lock:
            self._seen[key] = [md["namespace"], md["name"], 1, now, 1, ev.get("eventTime")]

    def _patch_series(self, force: bool) -> None:
        with self._lock:
            due = [s for s in self._seen.values() if s[2] > s[4]]
        for s in due:
            if s[2] > s[4]:
                try:
                    self._http.request(
                        "PATCH", f"/apis/events.k8s.io/v1/namespaces/{s[0]}/events/{s[1]}",
                        {"series": {"count": s[2], "lastObservedTime": s[5]}}, MERGE_PATCH,
                        decode=False)
                except KubeError as e:
                    self.stats["failed"] += 1
                    log.info("event series of %s not updated: %s", s[1], e)
                s[4] = s[2]
