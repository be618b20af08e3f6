"""List-and-watch reflector: a local cache of one resource kept in step with the API server.

Lists, then watches from the list's resourceVersion (with bookmarks). A watch that ends is
resumed from the last seen resourceVersion; a 410 (expired resourceVersion) relists and turns
the difference into synthetic events; an unreachable API server (restart, network) is retried
with capped exponential backoff, resuming the watch when the server is back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from cloud_core.errors import KubeError, KubeGone, KubeUnavailable
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.objects import Schema
from cloud_core.k8s.prefetch import ListAhead, pages

log = logging.getLogger(__name__)

# the longest a page of a list waits for its ``page_gate`` (a first decision takes ~0.1-0.5 s)
GATE_MAX_S = 2.0

Handler = Callable[[str, JSON, JSON | None], None]  # (type, obj, old obj)


def obj_key(obj: JSON) -> str:
    md = obj.get("metadata") or {}
    ns = md.get("namespace")
    return f"{ns}/{md.get('name')}" if ns else str(md.get("name"))


class Reflector:
    """Keeps ``store`` (key → object) in step with ``path``; calls ``handler`` on changes.

    ``resume_from`` starts by watching from a stored resourceVersion instead of listing (a
    410 then falls back to a list).

    ``synced`` is set once the store holds a whole list. ``prime`` (an extra query, e.g. the
    field selector of the pods already bound to a node) lets a consumer start earlier: the
    first time, the objects matching it are listed first and ``ready`` is set as soon as
    they are in the store; the full list then comes in page by page (each page handed to the
    handler as it arrives), and whatever vanished between the two lists is removed at its
    end. Without ``prime``, ``ready`` is set with ``synced``. The pages of a list are fetched
    ahead of their handling (``prefetch.ListAhead``); ``first`` / ``first_prime``: the first
    full / primed list, asked for before the reflector started (``prefetch.FirstLists``),
    taken if asked the same (path, page size, schema, query). ``pages_after``: the first full
    list waits for this event (the primed list does not). ``after_page`` is called once
    each listed page is in the store (and its changes handled). ``page_gate``: a page of
    the full list is handled only while this event is set (waiting at most ``GATE_MAX_S``
    for it): the actuator closes it while its first batch is decided, so that the rest of
    a backlog's pages do not take the interpreter from the first decision. ``schema``
    (``objects.POD``, ``objects.NODE``): the objects hold only what cfnet reads of that kind
    (lists and watch events alike; ``objects.py``).
    """

    def __init__(self, client: KubeClient, path: str, handler: Handler, *,
                 name: str = "", watch_timeout_s: int = 30, max_backoff_s: float = 5.0,
                 resume_from: str | None = None, prime: dict[str, str] | None = None,
                 page_size: int = 500, pages_after: threading.Event | None = None,
                 after_page: Callable[[], None] | None = None, schema: Schema | None = None,
                 first: ListAhead | None = None, first_prime: ListAhead | None = None,
                 page_gate: threading.Event | None = None, **query: Any) -> None:
        self.client = client
        self.path = path
        self.handler = handler
        self.name = name or path
        self.query = query
        self.schema = schema
        self.watch_timeout_s = watch_timeout_s
        self.max_backoff_s = max_backoff_s
        self.store: dict[str, JSON] = {}
        self.lock = threading.RLock()
        self.synced = threading.Event()
        self.ready = threading.Event()
        self.prime = prime
        self.page_size = page_size
        self.pages_after = pages_after
        self.after_page = after_page or (lambda: None)
        self.page_gate = page_gate
        self.stop_event = threading.Event()
        self.rv = resume_from or ""
        # lists asked for before this reflector started (prefetch.FirstLists), taken by the
        # first list if they were asked as it would ask
        self._first = first
        self._first_prime = first_prime
        self.stats = {"lists": 0, "watches": 0, "gone": 0, "unavailable": 0, "events": 0}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"reflector-{self.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(self.watch_timeout_s + 20)

    def items(self) -> list[JSON]:
        with self.lock:
            return list(self.store.values())

    def _relist(self) -> None:
        fresh: dict[str, JSON] = {}
        first, self._first = self._first, None
        first_prime, self._first_prime = self._first_prime, None
        if self.prime is not None and not self.ready.is_set():
            query = {**self.query, **self.prime}
            if first_prime is not None and first_prime.matches(self.path, self.page_size,
                                                               self.schema, query):
                items = [o for page, _ in first_prime for o in page]
            else:
                if first_prime is not None:
                    first_prime.close()
                items, _ = self.client.list(self.path, limit=self.page_size,
                                            schema=self.schema, **query)
            for o in items:
                self._merge(o)
            self.after_page()
            self.ready.set()
        elif first_prime is not None:
            first_prime.close()
        if self.pages_after is not None and not self.synced.is_set():
            while not self.pages_after.wait(0.5):  # the first full list only
                if self.stop_event.is_set():
                    if first is not None:
                        first.close()
                    return
        rv = ""
        # page N+1 is fetched while page N is handled (prefetch.py)
        for page, page_rv in pages(self.client, self.path, limit=self.page_size,
                                   schema=self.schema, first=first, **self.query):
            rv = page_rv
            if self.page_gate is not None:
                self.page_gate.wait(GATE_MAX_S)  # bounded: a stuck holder never stops it
            for o in page:
                fresh[obj_key(o)] = o
                self._merge(o)
            self.after_page()
        self.ready.set()
        self.stats["lists"] += 1
        with self.lock:
            gone = [o for k, o in self.store.items() if k not in fresh]
            self.store = fresh
        for o in gone:
            self._emit("DELETED", o, o)
        self.rv = rv
        self.synced.set()

    def _merge(self, o: JSON) -> None:
        """One listed object into the store, its change to the handler."""
        k = obj_key(o)
        with self.lock:
            prev = self.store.get(k)
            self.store[k] = o
        if prev is None:
            self._emit("ADDED", o, None)
        elif (prev.get("metadata") or {}).get("resourceVersion") != \
                (o.get("metadata") or {}).get("resourceVersion"):
            self._emit("MODIFIED", o, prev)

    def _emit(self, kind: str, obj: JSON, old: JSON | None) -> None:
        self.stats["events"] += 1
        try:
            self.handler(kind, obj, old)
        except Exception:  # a handler bug must not kill the cache
            log.exception("%s: handler failed on %s %s", self.name, kind, obj_key(obj))

    def _apply(self, kind: str, obj: JSON) -> None:
        k = obj_key(obj)
        with self.lock:
            old = self.store.get(k)
            if kind == "DELETED":
                self.store.pop(k, None)
            else:
                self.store[k] = obj
        self._emit(kind, obj, old)

    def run(self) -> None:
        backoff = 0.2
        while not self.stop_event.is_set():
            try:
                if not self.rv:
                    self._relist()
                    if self.stop_event.is_set():
                        return
                self.stats["watches"] += 1
                for kind, obj in self.client.watch(self.path, self.rv,
                                                   timeout_s=self.watch_timeout_s,
                                                   stop=self.stop_event, schema=self.schema,
                                                   **self.query):
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.rv = str(rv)
                    if kind != "BOOKMARK":
                        self._apply(kind, obj)
                    backoff = 0.2
                if self.rv and not self.synced.is_set():
                    self.synced.set()  # resumed from a stored RV and it was still valid
                    self.ready.set()
            except KubeGone:
                self.stats["gone"] += 1
                log.info("%s: resourceVersion %s expired; relisting", self.name, self.rv)
                self.rv = ""
            except KubeUnavailable as e:
                self.stats["unavailable"] += 1
                log.info("%s: API server unavailable (%s); retry in %.1fs", self.name, e, backoff)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
            except KubeError as e:
                log.warning("%s: %s; relisting in %.1fs", self.name, e, backoff)
                self.rv = ""
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
