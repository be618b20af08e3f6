"""Lists fetched ahead of their reader, by a thread of their own.

Two uses, both for the time to the first binding (``tools/bench_k8s.py``):

* A reflector's list (``informer.py``) asks for page N+1 while it handles page N, so the
  API server's time and the transfer of the next page overlap the handling of this one,
  instead of alternating with it (at 5,000 Nodes, 10 pages of 500).
* ``cfnet-core --kubernetes`` starts its first lists (every Node, the pods already bound to
  a node, the first pages of every pod) as soon as it has parsed its arguments
  (``FirstLists``), before it imports the placement engine (numpy, OR-Tools), opens
  SQLite and starts the MQTT child: the API server answers while the interpreter imports.
  The reflectors then take these lists as their first ones (``Reflector(first=...)``), and
  only when they were asked exactly as the reflector would ask (path, query, page size,
  schema); anything else is closed and the reflector lists as before.

At most ``ahead`` pages wait in memory (a page is bounded by ``limit=`` as before); the
producer stops when its reader closes it or its queue stays full past ``IDLE_S`` (a reader
that went away). An error of the producer (``KubeGone`` for an expired continue token,
``KubeUnavailable``...) is raised to the reader where the page would have been, so the
reflector's retry logic is unchanged.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cloud_core.errors import KubeUnavailable
from cloud_core.k8s import objects

if TYPE_CHECKING:
    from cloud_core.k8s.client import KubeClient, Page

log = logging.getLogger(__name__)

# pages fetched and not yet read, per list (each at most limit= objects). The reader keeps
# every object it lists (a reflector's store), so pages ahead cost no memory it would not
# hold anyway; the bound is for the pods' list, whose pages past the first batch's would
# only compete with the Nodes for the interpreter before the first decision (its decoding
# runs in this thread). The Nodes' list is wanted whole before deciding: NODES_AHEAD.
AHEAD = 2
NODES_AHEAD = 64
# a producer whose reader took nothing for this long gives up (its pages are dropped)
IDLE_S = 120.0
# The name of the scheduler the spec parser reads (placement.spec.SCHEDULER_NAME), here so
# that the first pods list needs no import of the engine. The actuator builds its schema
# from the parser's own: were they ever to differ, its reflector would not take this list
# (ListAhead.matches) and would list as before (tests/unit/test_prefetch.py checks them).
PARSER_SCHEDULER = "cfnet-scheduler"
# The queries of the actuator's lists (actuator.py), shared so that the early lists and
# the reflectors' ask the same
NODES_PATH = "/api/v1/nodes"
PODS_PATH = "/api/v1/pods"
BOUND_PODS: Mapping[str, Any] = {"fieldSelector": "spec.nodeName!="}
PAGE_SIZE = 500

_END = object()


def pod_schema(scheduler_name: str) -> objects.PodSchema:
    """The pods' lean schema of an actuator placing for ``scheduler_name``: whole specs for
    its pods and the spec parser's (see ``objects.PodSchema``)."""
    return objects.PodSchema(frozenset({scheduler_name, PARSER_SCHEDULER}))


class ListAhead:
    """The pages of one list (``client.list_pages``), fetched by a thread ahead of the
    reader: at most ``ahead`` wait. Iterate once; ``close`` when done or abandoning it."""

    def __init__(self, client: KubeClient, path: str, *, limit: int = PAGE_SIZE,
                 schema: objects.Schema | None = None, ahead: int = AHEAD, name: str = "",
                 **query: Any) -> None:
        self.path = path
        self.limit = limit
        self.schema = schema
        self.query = dict(query)
        self._client = client
        self._q: queue.Queue[Any] = queue.Queue(maxsize=max(1, ahead))
        self._closed = threading.Event()
        self._taken = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"list-{name or path}")
        self._thread.start()

    def matches(self, path: str, limit: int, schema: objects.Schema | None,
                query: Mapping[str, Any]) -> bool:
        """Whether this is the list a reader would ask for with these (a pod schema by the
        scheduler names it keeps whole, any other by identity)."""
        same_schema = schema is self.schema or (
            isinstance(schema, objects.PodSchema) and isinstance(self.schema, objects.PodSchema)
            and schema.whole == self.schema.whole)
        return (path == self.path and limit == self.limit and same_schema
                and dict(query) == self.query and not self._taken)

    def _put(self, item: Any) -> bool:
        waited = 0.0
        while not self._closed.is_set():
            try:
                self._q.put(item, timeout=0.5)
                return True
            except queue.Full:
                waited += 0.5
                if waited >= IDLE_S:
                    log.info("%s: list abandoned by its reader", self.path)
                    return False
        return False

    def _run(self) -> None:
        try:
            for page in self._client.list_pages(self.path, limit=self.limit,
                                                schema=self.schema, **self.query):
                if not self._put(page):
                    return
            self._put(_END)
        except BaseException as e:  # handed to the reader, raised there
            self._put(e)

    def __iter__(self) -> Iterator[Page]:
        if self._taken:
            raise RuntimeError(f"{self.path}: a list ahead is read once")
        self._taken = True
        try:
            while True:
                try:
                    item = self._q.get(timeout=1.0)
                except queue.Empty:
                    if self._thread.is_alive() or not self._q.empty():
                        continue
                    raise KubeUnavailable(f"LIST {self.path}: the list stopped (abandoned "
                                          f"after {IDLE_S:.0f} s unread)") from None
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop fetching; pages not read are dropped."""
        self._closed.set()
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                return


def pages(client: KubeClient, path: str, *, limit: int, schema: objects.Schema | None,
          first: ListAhead | None = None, **query: Any) -> Iterator[Page]:
    """The pages of a list, fetched ahead of the reader: ``first`` if it was asked the same
    (then used up), else a new ``ListAhead``."""
    if first is not None and first.matches(path, limit, schema, query):
        yield from first
        return
    if first is not None:
        first.close()
    yield from ListAhead(client, path, limit=limit, schema=schema, **query)


class FirstLists:
    """The actuator's first lists, started at once: every Node, the
    pods already bound to a node, and every pod (at most ``AHEAD`` pages ahead)."""

    def __init__(self, client: KubeClient, scheduler_name: str = PARSER_SCHEDULER) -> None:
        self.scheduler_name = scheduler_name
        schema = pod_schema(scheduler_name)
        self.nodes = ListAhead(client, NODES_PATH, schema=objects.NODE, name="nodes",
                               ahead=NODES_AHEAD)
        self.bound_pods = ListAhead(client, PODS_PATH, schema=schema, name="bound-pods",
                                    **BOUND_PODS)
        self.pods = ListAhead(client, PODS_PATH, schema=schema, name="pods")

    def close(self) -> None:
        for lst in (self.nodes, self.bound_pods, self.pods):
            lst.close()


