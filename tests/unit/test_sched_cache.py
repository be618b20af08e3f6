"""The scheduler cache (cloud_core/k8s/cache.py): assume, forget, finish binding, expiry and
the watch spending an assumption, table-driven on a fake clock. The same cache against a real
API server: tests/k8s/test_actuator.py (every assumption spent by the watch)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cloud_core.k8s.cache import Bound, SchedulerCache
from cloud_core.placement.model import Resources, RunningPod, Workload


def workload(uid: str, cpu: int = 100) -> Workload:
    return Workload(uid=uid, name=uid, requests=Resources(cpu_milli=cpu, mem_bytes=1 << 20))


def bound(key: str, uid: str, node: str, cpu: int = 100, live: bool = True) -> Bound:
    ns, _, name = key.partition("/")
    return Bound(rv="1", node=node, key=key, live=live,
                 pod=RunningPod.of(workload(uid, cpu), node, uid=uid, name=name, namespace=ns),
                 own=None)


@dataclass(frozen=True)
class Case:
    name: str
    steps: tuple[tuple, ...]  # (op, *args) applied in order at the time given
    assumed: dict[str, str]  # what is assumed at the end: key -> node
    cpu: dict[str, int]  # the view's cpu per node at the end
    ttl_s: float | None = None


CASES = [
    Case("assumed pods count on their node",
         (("assume", "ns/a", "n1", 100), ("assume", "ns/b", "n1", 200),
          ("assume", "ns/c", "n2", 50)),
         {"ns/a": "n1", "ns/b": "n1", "ns/c": "n2"}, {"n1": 300, "n2": 50}),
    Case("a failed binding is forgotten",
         (("assume", "ns/a", "n1", 100), ("forget", "ns/a")), {}, {}),
    Case("the watch showing the pod bound spends the assumption, counted once",
         (("assume", "ns/a", "n1", 100), ("bind", "ns/a", "ua", "n1", 100)),
         {}, {"n1": 100}),
    Case("bound but the watch not yet caught up elsewhere: the bound pod counts, once",
         (("assume", "ns/a", "n1", 100), ("bind", "ns/b", "ub", "n1", 30)),
         {"ns/a": "n1"}, {"n1": 130}),
    Case("a deleted pod's assumption goes with it",
         (("assume", "ns/a", "n1", 100), ("delete", "ns/a", "ua")), {}, {}),
    Case("no TTL: a finished binding stays assumed until the watch shows it",
         (("assume", "ns/a", "n1", 100), ("finish", "ns/a", 0.0), ("cleanup", 1e9)),
         {"ns/a": "n1"}, {"n1": 100}),
    Case("a finished binding the watch never shows expires after the TTL",
         (("assume", "ns/a", "n1", 100), ("finish", "ns/a", 10.0), ("cleanup", 39.0),
          ("cleanup", 40.0)), {}, {}, ttl_s=30.0),
    Case("a binding still in flight never expires",
         (("assume", "ns/a", "n1", 100), ("cleanup", 1e9)), {"ns/a": "n1"}, {"n1": 100},
         ttl_s=30.0),
    Case("a pod that finished stops counting on its node",
         (("bind", "ns/a", "ua", "n1", 100), ("finish_pod", "ns/a", "ua", "n1", 100)),
         {}, {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scheduler_cache(case: Case) -> None:
    c = SchedulerCache(case.ttl_s)
    for op, *args in case.steps:
        if op == "assume":
            key, node, cpu = args
            c.assume(key, node, workload(key, cpu))
        elif op == "forget":
            assert c.forget(args[0])
            assert not c.forget(args[0])  # once
        elif op == "finish":
            c.finish_binding(args[0], args[1])
        elif op == "cleanup":
            c.cleanup_expired(args[0])
        elif op == "bind":
            key, uid, node, cpu = args
            c.set_pod(key, uid, bound(key, uid, node, cpu), {})
        elif op == "finish_pod":
            key, uid, node, cpu = args
            c.set_pod(key, uid, bound(key, uid, node, cpu, live=False), {})
        elif op == "delete":
            key, uid = args
            c.set_pod(key, uid, None, {}, deleted=True)
    assert c.assumed() == case.assumed
    assert all(c.is_assumed(k) for k in case.assumed)
    view = c.view()
    assert {n: a[0] for n, a in view.usage.items() if a[0]} == case.cpu
    assert sum(p.requests.cpu_milli for p in view.running) == sum(case.cpu.values())


def test_cleanup_expired_names_what_it_dropped() -> None:
    c = SchedulerCache(ttl_s=5.0)
    c.assume("ns/a", "n1", workload("a"))
    c.assume("ns/b", "n1", workload("b"))
    c.finish_binding("ns/a", 0.0)
    assert c.cleanup_expired(4.9) == []
    assert c.cleanup_expired(5.0) == ["ns/a"]
    assert c.assumed() == {"ns/b": "n1"}


def test_a_view_leaves_out_the_pods_to_revalidate() -> None:
    c = SchedulerCache()
    c.set_pod("ns/a", "ua", bound("ns/a", "ua", "n1", 100), {})
    c.set_pod("ns/b", "ub", bound("ns/b", "ub", "n1", 40), {})
    view = c.view(frozenset({"ua"}))
    assert view.usage["n1"][0] == 40 and [p.uid for p in view.running] == ["ub"]
    assert c.used("n1") == (140, 2 << 20, 0)  # the cache itself is unchanged
    assert c.is_bound("ns/a") and not c.is_bound("ns/c")
