"""The lean Pod/Node schemas (cloud_core/k8s/objects.py): what cfnet reads comes through
exactly as the generic decoder gives it, the rest is skipped, and odd or hostile shapes are
read as before (generic fallback) or refused as before.

The same decoding runs against the real API server in tests/k8s/test_client.py and under the
actuator in every tests/k8s test (its reflectors use these schemas).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from cloud_core.k8s import objects
from tools.bench_decode import node, pages, pod

_encode = msgspec.json.Encoder().encode
_generic = msgspec.json.Decoder().decode


def lean_of(obj: dict[str, Any], status_keys: tuple[str, ...]) -> dict[str, Any]:
    """``obj`` as the schema should give it: no managedFields, status cut to ``status_keys``."""
    out = dict(obj)
    out["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    out["status"] = {k: v for k, v in obj["status"].items() if k in status_keys}
    return out


def test_pod_page_keeps_what_cfnet_reads_and_the_whole_spec() -> None:
    objs = [pod(i, 10) for i in range(7)]
    objs[3]["spec"]["someFutureField"] = {"x": [1, 2]}  # the parser must still see it
    objs[4]["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    (data,) = pages(objs, "Pod")
    page = objects.POD.page(data)
    assert page["metadata"] == {"resourceVersion": "999999"}
    assert page["items"] == [lean_of(o, ("phase",)) for o in objs]
    assert page["items"][3]["spec"]["someFutureField"] == {"x": [1, 2]}
    assert all(type(o) is dict for o in page["items"])


def test_node_page_keeps_labels_taints_capacity_conditions() -> None:
    objs = [node(i) for i in range(3)]
    objs[1]["spec"]["taints"] = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
    objs[1]["spec"]["unschedulable"] = True
    pages_ = pages(objs, "Node", per_page=2)
    first = objects.NODE.page(pages_[0])
    assert first["metadata"] == {"resourceVersion": "999999", "continue": "token-0"}
    got = first["items"] + objects.NODE.page(pages_[1])["items"]
    assert got == [lean_of(o, ("capacity", "allocatable", "conditions")) for o in objs]
    assert "images" not in got[0]["status"] and "managedFields" not in got[0]["metadata"]


@pytest.mark.parametrize("body", [
    {"metadata": [], "items": []},              # metadata not an object
    {"metadata": {}, "items": {"a": 1}},        # items not a list
    {"items": [1, "x", None]},                  # items not objects
    {"items": [{"metadata": "m", "spec": 1}]},  # an item's metadata not an object
    {"items": [{"status": [1]}]},               # status not an object
    [1, 2],                                     # not a list at all
])
def test_a_page_that_does_not_fit_reads_as_the_generic_decoder_reads_it(body: Any) -> None:
    data = _encode(body)
    before = objects.STATS["fallback"]
    assert objects.POD.page(data) == _generic(data)
    assert objects.STATS["fallback"] == before + 1


def test_wrong_leaf_types_pass_through_for_the_readers_to_refuse() -> None:
    # labels a list, phase a number, spec a string: typed Any, so exactly as before; the
    # spec parser and the pod handler check them where they read them
    o = {"metadata": {"name": "p", "labels": ["a"], "uid": 5}, "spec": "x",
         "status": {"phase": 3, "conditions": 1}}
    data = _encode({"items": [o]})
    before = objects.STATS["fallback"]
    assert objects.POD.page(data)["items"] == [{"metadata": o["metadata"], "spec": "x",
                                               "status": {"phase": 3}}]
    assert objects.STATS["fallback"] == before


def test_malformed_json_is_refused_as_before() -> None:
    for data in (b'{"items": [', b"", b'{"items": [{"metadata": {"name": "a"}]}'):
        with pytest.raises(msgspec.DecodeError):
            _generic(data)
        with pytest.raises(msgspec.DecodeError):
            objects.POD.page(data)


def test_deep_nesting_is_bounded_as_before() -> None:
    # deep inside what is skipped and inside what is kept: msgspec's depth limit either way
    deep = b"[" * 5000 + b"]" * 5000
    for data in (b'{"items": [{"metadata": {"managedFields": ' + deep + b"}}]}",
                 b'{"items": [{"spec": ' + deep + b"}]}"):
        kinds = []
        for decode in (_generic, objects.POD.page):
            try:
                decode(data)
                kinds.append("ok")
            except (msgspec.DecodeError, RecursionError) as e:
                kinds.append(type(e).__name__)
        assert kinds[0] == kinds[1], kinds


def test_a_huge_skipped_part_is_not_materialised() -> None:
    o = pod(1, 1)
    o["metadata"]["managedFields"] = [{"manager": f"m{i}", "fieldsV1": {"f:x": {}}}
                                      for i in range(50_000)]
    o["status"]["containerStatuses"] = [{"name": f"c{i}"} for i in range(50_000)]
    (item,) = objects.POD.page(_encode({"items": [o]}))["items"]
    assert "managedFields" not in item["metadata"]
    assert item["status"] == {"phase": "Running"}


def test_watch_events() -> None:
    o = pod(2, 3)
    ev = objects.POD.event(_encode({"type": "MODIFIED", "object": o}))
    assert ev == {"type": "MODIFIED", "object": lean_of(o, ("phase",))}
    # an ERROR carries a Status: kept whole (the client raises with its code)
    st = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
          "reason": "Expired", "message": "too old resource version"}
    assert objects.POD.event(_encode({"type": "ERROR", "object": st})) == \
        {"type": "ERROR", "object": st}
    bm = {"kind": "Pod", "apiVersion": "v1", "metadata": {
        "resourceVersion": "77", "annotations": {"k8s.io/initial-events-end": "true"}}}
    assert objects.NODE.event(_encode({"type": "BOOKMARK", "object": bm})) == \
        {"type": "BOOKMARK", "object": bm}


@pytest.mark.parametrize("body", [
    {"type": "ADDED"}, {"type": "ADDED", "object": None}, {"type": 1, "object": {}},
    {"type": "ADDED", "object": {"metadata": 5}}, {"type": "ADDED", "object": [1]}, [1],
    "x",
])
def test_odd_watch_events_read_as_before(body: Any) -> None:
    data = _encode(body)
    assert objects.POD.event(data) == _generic(data)


# -- the spec of a pod another scheduler places (PodSchema) -----------------------------------

OURS = objects.PodSchema(frozenset({"cfnet-scheduler"}))


def _other_pods() -> list[dict[str, Any]]:
    """Pods of another scheduler with every part usage_workload reads, plus some it does not."""
    base = pod(0, 1)  # i % 2 == 0: default-scheduler
    sidecar = {"name": "side", "restartPolicy": "Always", "image": "x",
               "ports": [{"containerPort": 9000, "hostPort": 9000, "protocol": "UDP"}],
               "resources": {"requests": {"cpu": "50m"}}}
    init = {"name": "init", "image": "y", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
            "ports": [{"containerPort": 1, "hostPort": 1}]}
    aff = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "a"}}, "topologyKey": "kubernetes.io/hostname"}]},
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5, "podAffinityTerm": {"labelSelector": {}, "topologyKey": "zone"}}]}}
    out = []
    for extra in ({}, {"initContainers": [init, sidecar]}, {"affinity": aff},
                  {"hostNetwork": True, "overhead": {"cpu": "10m"}},
                  {"resources": {"requests": {"memory": "2Gi"}}, "schedulingGates": [{"name": "g"}],
                   "someFutureField": 1},
                  {"containers": [{"name": "bad", "resources": {"requests": {"cpu": "lots"}},
                                   "ports": [{"hostPort": 99999}]}]}):
        o = dict(base, spec={**base["spec"], **extra})
        o["metadata"] = dict(base["metadata"], name=f"p{len(out)}", uid=f"u{len(out)}")
        out.append(o)
    return out


def test_other_schedulers_pods_count_on_their_node_exactly_as_before() -> None:
    from cloud_core.errors import SpecError
    from cloud_core.placement.spec import parse_pod, usage_workload

    objs = _other_pods()
    full = _generic(pages(objs, "Pod")[0])["items"]
    lean = OURS.page(pages(objs, "Pod")[0])["items"]
    for f, le in zip(full, lean, strict=True):
        assert le["spec"]["schedulerName"] == "default-scheduler"
        assert "volumes" not in le["spec"] and "tolerations" not in le["spec"]
        assert usage_workload(le) == usage_workload(f)
        with pytest.raises(SpecError) as a:
            parse_pod(f)
        with pytest.raises(SpecError) as b:
            parse_pod(le)
        assert str(a.value) == str(b.value)


def test_cfnet_pods_keep_the_whole_spec_so_unsupported_fields_are_refused() -> None:
    from cloud_core.errors import SpecError
    from cloud_core.placement.spec import parse_pod

    o = pod(1, 1)  # i % 2 == 1: cfnet-scheduler
    o["spec"]["someFutureField"] = {"a": 1}
    unnamed = pod(3, 1)
    del unnamed["spec"]["schedulerName"]  # the parser reads past an absent one: whole too
    items = OURS.page(pages([o, unnamed], "Pod")[0])["items"]
    assert items[0]["spec"] == o["spec"] and items[1]["spec"] == unnamed["spec"]
    with pytest.raises(SpecError, match=r"spec\.someFutureField"):
        parse_pod(items[0])
    # a watch event's pod is decoded the same way
    ev = OURS.event(_encode({"type": "ADDED", "object": o}))
    assert ev["object"]["spec"] == o["spec"]


@pytest.mark.parametrize("spec", [
    {"schedulerName": "other", "containers": {"a": 1}},     # containers not a list
    {"schedulerName": "other", "containers": [1, "x"]},     # containers not objects
    {"schedulerName": "other", "initContainers": None},     # null where a list goes
    {"schedulerName": 7, "containers": []},                 # schedulerName not a string
    "a string", None, [1],
])
def test_an_odd_spec_is_kept_whole(spec: Any) -> None:
    data = _encode({"items": [{"metadata": {"name": "p"}, "spec": spec}]})
    assert OURS.page(data)["items"][0]["spec"] == spec
