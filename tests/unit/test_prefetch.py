"""Lists fetched ahead of their reader (``cloud_core/k8s/prefetch.py``), over a fake client (an
I/O edge: the same path runs against the real API server in
tests/k8s/test_actuator.py::test_first_lists_real_apiserver), and the registry's parsed
allocatable maps (``registry.allocatable_of``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cloud_core.errors import KubeGone
from cloud_core.k8s import objects, prefetch, registry
from cloud_core.k8s.informer import Reflector
from cloud_core.k8s.prefetch import ListAhead

Obj = dict[str, Any]
Page = tuple[list[Obj], str]


def obj(name: str, rv: int = 1) -> Obj:
    return {"metadata": {"name": name, "resourceVersion": str(rv)}}


class FakePagingClient:
    """A fake of KubeClient.list_pages: canned pages, each one counted as it is fetched,
    an optional error after them."""

    def __init__(self, pages: list[list[Obj]], error: BaseException | None = None) -> None:
        self.pages = pages
        self.error = error
        self.fetched = 0
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.more = threading.Condition()

    def list_pages(self, path: str, **query: Any) -> Iterator[Page]:
        self.asked.append((path, query))
        for page in self.pages:
            with self.more:
                self.fetched += 1
                self.more.notify_all()
            yield page, "7"
        if self.error is not None:
            raise self.error

    def wait_fetched(self, n: int) -> bool:
        with self.more:
            return self.more.wait_for(lambda: self.fetched >= n, timeout=5)

    def watch(self, path: str, rv: str, **kw: Any) -> Iterator[tuple[str, Obj]]:
        stop = kw.get("stop")
        assert stop is not None
        stop.wait(10)
        return iter(())


def test_the_parser_scheduler_name_is_the_spec_parsers() -> None:
    """prefetch names it without importing the engine; the actuator builds its schema from
    the parser's own, so a difference would only cost the early list."""
    from cloud_core.placement.spec import SCHEDULER_NAME

    assert prefetch.PARSER_SCHEDULER == SCHEDULER_NAME


def test_pages_come_in_order_and_at_most_ahead_wait() -> None:
    fake = FakePagingClient([[obj(f"o{i}")] for i in range(6)])
    ahead = ListAhead(fake, "/api/v1/nodes", limit=1, ahead=2)  # type: ignore[arg-type]
    try:
        assert fake.wait_fetched(3), "the list was not fetched ahead of its reader"
        # two pages in the queue and a third in the producer's hands: a fourth needs room,
        # which only a read makes
        assert fake.fetched == 3, f"fetched {fake.fetched} pages before any was read"
        got = [p[0][0]["metadata"]["name"] for p in ahead]
        assert got == [f"o{i}" for i in range(6)]
        assert fake.asked == [("/api/v1/nodes", {"limit": 1, "schema": None})]
    finally:
        ahead.close()


def test_the_producers_error_is_raised_where_the_page_would_be() -> None:
    fake = FakePagingClient([[obj("a")]], error=KubeGone("continue token expired", 410))
    ahead = ListAhead(fake, "/api/v1/pods")  # type: ignore[arg-type]
    it = iter(ahead)
    assert next(it)[0][0]["metadata"]["name"] == "a"
    with pytest.raises(KubeGone):
        next(it)


def test_a_list_ahead_is_read_once_and_only_as_asked() -> None:
    fake = FakePagingClient([[obj("a")]])
    schema = prefetch.pod_schema("cfnet-scheduler")
    ahead = ListAhead(fake, "/api/v1/pods", schema=schema,  # type: ignore[arg-type]
                      fieldSelector="spec.nodeName!=")
    q = {"fieldSelector": "spec.nodeName!="}
    assert ahead.matches("/api/v1/pods", prefetch.PAGE_SIZE, prefetch.pod_schema("cfnet-scheduler"), q)
    assert not ahead.matches("/api/v1/pods", prefetch.PAGE_SIZE, schema, {})
    assert not ahead.matches("/api/v1/pods", 100, schema, q)
    assert not ahead.matches("/api/v1/pods", prefetch.PAGE_SIZE, prefetch.pod_schema("other"), q)
    assert not ahead.matches("/api/v1/pods", prefetch.PAGE_SIZE, objects.NODE, q)
    assert [p for p, _ in ahead] == [[obj("a")]]
    assert not ahead.matches("/api/v1/pods", prefetch.PAGE_SIZE, schema, q)  # used up
    with pytest.raises(RuntimeError):
        list(ahead)


def test_a_reflector_takes_an_early_list_asked_as_it_asks_and_only_that() -> None:
    early = FakePagingClient([[obj("early")]])
    own = FakePagingClient([[obj("own")]])
    for first, want in ((ListAhead(early, "/api/v1/nodes", limit=500), "early"),  # type: ignore[arg-type]
                        (ListAhead(early, "/api/v1/nodes", limit=10), "own")):  # type: ignore[arg-type]
        r = Reflector(own, "/api/v1/nodes", lambda *_: None, first=first)  # type: ignore[arg-type]
        r.start()
        try:
            assert r.synced.wait(5), "the reflector never listed"
            assert [o["metadata"]["name"] for o in r.items()] == [want]
        finally:
            r.stop_event.set()


NODE_ALLOC = {"cpu": "8", "memory": "32Gi", "pods": "110", "example.com/fpga": "2",
              "ephemeral-storage": "100Gi"}


def node(name: str, alloc: dict[str, Any]) -> Obj:
    return {"metadata": {"name": name, "labels": {}}, "spec": {},
            "status": {"allocatable": alloc}}


def test_parsed_allocatable_maps_are_the_unmemoized_parse() -> None:
    cfg = registry.RegistryConfig()
    registry._alloc_memo.clear()
    first = registry.record_of(node("a", NODE_ALLOC), cfg)
    second = registry.record_of(node("b", dict(NODE_ALLOC)), cfg)
    assert len(registry._alloc_memo) == 1
    assert (second.capacity, second.max_pods, second.extended) == \
        (first.capacity, first.max_pods, first.extended)
    fresh_max, fresh_ext = registry.other_allocatable(NODE_ALLOC)
    assert (first.max_pods, dict(first.extended)) == (fresh_max, fresh_ext)
    assert first.capacity == registry.bounded_resources(registry.resources_of(NODE_ALLOC))


def test_odd_allocatable_values_are_parsed_every_time_and_never_kept() -> None:
    """A number where the API has a string: 1 and True would share a key."""
    cfg = registry.RegistryConfig()
    registry._alloc_memo.clear()
    for alloc in ({"cpu": "4", "pods": 7}, {"cpu": "4", "pods": True},
                  {"cpu": "4", "memory": ["1Gi"]}, {"cpu": "4", "memory": {"x": 1}}):
        registry.record_of(node("n", alloc), cfg)
    assert registry._alloc_memo == {}


def test_the_memo_is_bounded() -> None:
    cfg = registry.RegistryConfig()
    registry._alloc_memo.clear()
    for i in range(registry.ALLOC_MEMO_MAX * 2 + 3):
        registry.record_of(node(f"n{i}", {"cpu": f"{i + 1}", "memory": "1Gi"}), cfg)
        assert len(registry._alloc_memo) <= registry.ALLOC_MEMO_MAX
    rec = registry.record_of(node("m", {"cpu": "3", "memory": "1Gi"}), cfg)
    assert rec.capacity.cpu_milli == 3000
