"""Reflector start-up with a primed list, over a fake client (an I/O edge: the same path runs
against the real API server in tests/k8s/test_actuator.py::test_primed_reflector_real_apiserver).

``prime`` lists the pods already bound first and sets ``ready`` as soon as they are in the
store; the full list then arrives page by page (fetched ahead by a thread of its own,
``prefetch.ListAhead``), each page handed to the handler as it comes; what vanished between
the two lists is removed at the end.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from cloud_core.k8s.informer import Reflector

Obj = dict[str, Any]
Page = tuple[list[Obj], str]


def pod(name: str, node: str = "", rv: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)},
            "spec": {"nodeName": node} if node else {}}


class FakeClient:
    """A fake of KubeClient's list/list_pages/watch: canned pages, a gate before page 2."""

    def __init__(self, primed: list[dict[str, Any]], pages: list[list[dict[str, Any]]]) -> None:
        self.primed = primed
        self.pages = pages
        self.gate = threading.Event()  # page 2 and later wait for it
        self.asked: list[dict[str, Any]] = []
        self.listing = threading.Event()  # the full list was asked for (by its own thread)

    def list(self, path: str, **query: Any) -> Page:
        self.asked.append(query)
        return list(self.primed), "10"

    def list_pages(self, path: str, **query: Any) -> Iterator[Page]:
        self.asked.append(query)
        self.listing.set()
        for i, page in enumerate(self.pages):
            if i:
                assert self.gate.wait(10)
            yield page, "20"

    def watch(self, path: str, rv: str, **kw: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        stop = kw.get("stop")
        assert stop is not None
        stop.wait(10)
        return iter(())


def test_ready_before_the_whole_list() -> None:
    bound_then_deleted = pod("gone", node="n1", rv=5)
    bound = pod("b", node="n1", rv=6)
    fake = FakeClient([bound_then_deleted, bound],
                      [[pod("p1", rv=11), pod("p2", rv=12), pod("b", node="n1", rv=6)],
                       [pod("p3", rv=13)]])
    seen: list[tuple[str, str]] = []
    r = Reflector(fake, "/api/v1/pods", lambda kind, obj, old: seen.append(  # type: ignore[arg-type]
        (kind, obj["metadata"]["name"])), prime={"fieldSelector": "spec.nodeName!="},
        page_size=3)
    r.start()
    try:
        assert r.ready.wait(5)
        assert not r.synced.is_set()  # page 2 is held back
        names = {o["metadata"]["name"] for o in r.items()}
        assert {"gone", "b"} <= names  # every bound pod is in before deciding starts
        # the primed query first, with its field selector; then the full list
        assert fake.asked[0] == {"limit": 3, "schema": None, "fieldSelector": "spec.nodeName!="}
        # the full list's pages are fetched by a thread of their own (prefetch.ListAhead)
        assert fake.listing.wait(5), "the full list was never asked for"
        assert fake.asked[1] == {"limit": 3, "schema": None}
        fake.gate.set()
        assert r.synced.wait(5)
        assert {o["metadata"]["name"] for o in r.items()} == {"b", "p1", "p2", "p3"}
        # bound pods, then page 1 as it came (b unchanged: no event), page 2, and at the end
        # the pod that the full list no longer has
        assert seen == [("ADDED", "gone"), ("ADDED", "b"), ("ADDED", "p1"), ("ADDED", "p2"),
                        ("ADDED", "p3"), ("DELETED", "gone")]
        assert r.rv == "20"
    finally:
        r.stop_event.set()


def test_without_prime_ready_comes_with_the_whole_list() -> None:
    fake = FakeClient([], [[pod("p1")], [pod("p2")]])
    r = Reflector(fake, "/api/v1/pods", lambda *a: None)  # type: ignore[arg-type]
    r.start()
    try:
        assert not r.ready.wait(0.3)  # page 1 is in, page 2 held back: not ready
        assert len(fake.asked) == 1  # no primed list
        fake.gate.set()
        assert r.synced.wait(5) and r.ready.is_set() and len(r.items()) == 2
    finally:
        r.stop_event.set()


def test_tune_gc_raises_the_young_threshold() -> None:
    import gc

    from cloud_core.k8s.gc_tuning import GC_TUNED, tune_gc

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        tune_gc()
        assert gc.get_threshold() == (20_000, 20, 20)
    finally:
        gc.set_threshold(*before)
        GC_TUNED.clear()


def test_listed_pages_are_frozen_out_of_the_collector_only_in_a_tuned_process() -> None:
    """``after_page`` runs once per listed page (the primed list is one); the actuator's
    ``settle_listed`` freezes the heap there only once ``tune_gc`` ran (an entry point),
    never in a library caller's process."""
    import gc

    from cloud_core.k8s import gc_tuning

    calls: list[int] = []
    fake = FakeClient([pod("b", node="n1")], [[pod("p1")], [pod("p2")]])
    fake.gate.set()
    r = Reflector(fake, "/api/v1/pods", lambda *a: None,  # type: ignore[arg-type]
                  prime={"fieldSelector": "spec.nodeName!="},
                  after_page=lambda: calls.append(len(r.store)))
    r.start()
    try:
        assert r.synced.wait(5)
        assert calls == [1, 2, 3]  # primed list, then each page, after its objects are in
    finally:
        r.stop_event.set()

    before = gc.get_threshold()
    gc.unfreeze()
    gc_tuning.GC_TUNED.clear()
    try:
        gc_tuning.settle_listed()
        assert gc.get_freeze_count() == 0  # not tuned: the heap is the caller's
        gc_tuning.tune_gc()
        gc_tuning.settle_listed()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc_tuning.GC_TUNED.clear()
        gc.set_threshold(*before)


class HeldBindings:
    """A fake of the API client's ``bind_pod`` (the binder's one I/O edge here): each
    binding waits until ``release`` lets one through."""

    def __init__(self) -> None:
        self.gate = threading.Semaphore(0)

    def bind_pod(self, ns: str, name: str, uid: str, node: str, **kw: object) -> None:
        assert self.gate.acquire(timeout=10)

    def record_event(self, *a: Any, **kw: Any) -> None:
        pass


def start_bindings(act: Any, n: int) -> list[threading.Thread]:
    """``n`` bindings in flight through the actuator's binder (held by HeldBindings)."""
    from cloud_core.placement.model import Resources, Workload

    threads = []
    for i in range(n):
        p = {"metadata": {"name": f"b{i}", "namespace": "ns", "uid": f"ub{i}"}}
        w = Workload(uid=f"ub{i}", name=f"b{i}", requests=Resources())
        t = threading.Thread(target=act.binder.bind, args=(p, "n1", w))
        t.start()
        threads.append(t)
    return threads


def in_flight(act: Any, n: int) -> bool:
    import time

    until = time.monotonic() + 5
    while act.binder.in_flight() != n and time.monotonic() < until:
        time.sleep(0.01)
    return bool(act.binder.in_flight() == n)


def test_a_burst_still_binding_counts_as_a_backlog() -> None:
    """More bindings in flight than the binding workers take at once: the observation says
    backlog (a due re-plan waits for them); at most that many in flight: no backlog. No
    reflector is started: the client only takes the bindings."""
    from cloud_core.k8s.config import ActuatorConfig
    from cloud_core.k8s.wiring import build_actuator

    client = HeldBindings()
    act = build_actuator(client, config=ActuatorConfig(bind_workers=4))  # type: ignore[arg-type]
    threads = start_bindings(act, 5)
    try:
        act.pods.synced.set()
        assert in_flight(act, 5)
        assert act.observe().backlog is True
        client.gate.release()
        assert in_flight(act, 4)
        assert act.observe().backlog is False
    finally:
        for _ in threads:
            client.gate.release()
        for t in threads:
            t.join(5)
        act.stop()
    assert act.stats.bound == 5


def test_the_cp_sat_warm_up_waits_while_a_burst_is_under_way() -> None:
    """``Actuator.busy`` (what the background CP-SAT import waits on, wiring.py): the pods'
    first list still coming, a pod to try now, a batch being decided, or a binding in flight;
    none of them: a lull. Built as above (no reflector started)."""
    import time

    from cloud_core.k8s.wiring import build_actuator

    client = HeldBindings()
    act = build_actuator(client)  # type: ignore[arg-type]
    pending = act.parts.pending
    try:
        assert act.busy()  # the pods' list is not in yet
        act.pods.synced.set()
        assert not act.busy()
        (t,) = start_bindings(act, 1)
        assert in_flight(act, 1) and act.busy()
        client.gate.release()
        t.join(5)
        assert not act.busy()
        p = {"metadata": {"name": "p", "namespace": "ns", "uid": "up"},
             "spec": {"schedulerName": "cfnet-scheduler"}}
        pending.arrived("ns/p", p, None, time.monotonic())
        assert act.busy()
        assert pending.pop(10, time.monotonic(), None, lambda k: False) == [p]
        assert act.busy()  # taken by a step, being decided: not a lull either
        pending.left("ns/p")
        assert not act.busy()
    finally:
        act.stop()


def test_a_closed_page_gate_holds_the_full_lists_pages() -> None:
    """``page_gate`` (the actuator closes it while its first batch is decided): no page of
    the full list is handled while it is closed; the primed list is not held; opening it
    lets the list go on, and a gate never opened holds a page at most GATE_MAX_S."""
    import cloud_core.k8s.informer as informer

    fake = FakeClient([pod("b", node="n1", rv=6)], [[pod("p1", rv=11)], [pod("p2", rv=12)]])
    fake.gate.set()
    gate = threading.Event()
    seen: list[str] = []
    r = Reflector(fake, "/api/v1/pods", lambda kind, obj, old: seen.append(  # type: ignore[arg-type]
        obj["metadata"]["name"]), prime={"fieldSelector": "spec.nodeName!="}, page_size=1,
        page_gate=gate)
    r.start()
    try:
        assert r.ready.wait(5)  # the primed list is in, gate or not
        assert fake.listing.wait(5)
        assert not r.synced.wait(0.3)
        assert seen == ["b"]  # page 1 waits for the gate
        gate.set()
        assert r.synced.wait(5)
        assert seen[:3] == ["b", "p1", "p2"]  # (then b, gone from the full list)
    finally:
        r.stop_event.set()
    old, informer.GATE_MAX_S = informer.GATE_MAX_S, 0.2
    try:
        fake = FakeClient([], [[pod("p1", rv=11)]])
        r = Reflector(fake, "/api/v1/pods", lambda *a: None,  # type: ignore[arg-type]
                      page_size=1, page_gate=threading.Event())
        r.start()
        assert r.synced.wait(5)  # held 0.2 s, then handled all the same
    finally:
        informer.GATE_MAX_S = old
        r.stop_event.set()
