"""PodParser: parse_pod with a memo for a controller's pods; it must answer exactly as
parse_pod does, pod by pod, refusals included."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cloud_core.errors import SpecError
from cloud_core.placement.spec import PodParser, parse_pod
from tools.bench_k8s import pod_object


def pods() -> list[dict[str, Any]]:
    out = []
    for i in range(200):  # the bench's mix: affinity, tolerations, spread, requests
        p = pod_object(i, f"ns-{i % 3}", "cfnet-scheduler")
        p["metadata"]["uid"] = f"uid-{i}"
        out.append(p)
    return out


def test_same_answers_as_parse_pod() -> None:
    parser = PodParser()
    for p in pods() + pods():
        assert parser.parse(p) == parse_pod(p)
    assert parser.hits > 200  # the second round and the repeats within the mix came from it


@pytest.mark.parametrize(("change", "path"), [
    (lambda p: p["metadata"].__setitem__("name", "Bad_Name"), "metadata.name"),
    (lambda p: p["metadata"].__setitem__("name", ""), "metadata.name"),
    (lambda p: p["metadata"].pop("name"), "metadata.name"),
    (lambda p: p["spec"].__setitem__("schedulingGates", [{"name": "g"}]),
     "spec.schedulingGates"),
    (lambda p: p["spec"].__setitem__("futureField", 1), "spec.futureField"),
    (lambda p: p["metadata"]["labels"].__setitem__("app", "x" * 70), "metadata.labels"),
], ids=["bad-name", "empty-name", "no-name", "gated", "unknown-field", "bad-label"])
def test_refusals_after_a_memoised_twin(change: Any, path: str) -> None:
    """A pod that differs from a memoised one only where it is wrong is still refused, with
    parse_pod's reason; the refusal is not memoised."""
    parser = PodParser()
    good = pods()[0]
    parser.parse(good)
    bad = copy.deepcopy(good)
    bad["metadata"]["uid"] = "other"
    change(bad)
    for _ in range(2):
        with pytest.raises(SpecError) as e:
            parser.parse(bad)
        assert e.value.field.startswith(path)
    with pytest.raises(SpecError) as e2:
        parse_pod(bad)
    assert str(e2.value) == str(e.value)


def test_uid_and_name_are_each_pods_own() -> None:
    parser = PodParser()
    a, b = pods()[0], copy.deepcopy(pods()[0])
    b["metadata"].update(name="p-other", uid="uid-other")
    wa, wb = parser.parse(a), parser.parse(b)
    assert (wa.uid, wa.name, wb.uid, wb.name) == ("uid-0", "p-00000", "uid-other", "p-other")
    assert parser.hits == 1


def test_memo_is_bounded() -> None:
    parser = PodParser(max_entries=10)
    for p in pods()[:60]:
        parser.parse(p)
    assert len(parser._memo) <= 10


def _with_sa_volume(p: dict[str, Any], suffix: str, source: str = "projected"
                    ) -> dict[str, Any]:
    """As the API server's ServiceAccount admission leaves a pod: a randomly named volume."""
    p = copy.deepcopy(p)
    name = f"kube-api-access-{suffix}"
    p["spec"]["volumes"] = [{"name": name, source: {}}]
    for c in p["spec"]["containers"]:
        c["volumeMounts"] = [{"name": name, "mountPath": "/var/run/secrets/x"}]
    return p


def test_service_account_volumes_do_not_defeat_the_memo() -> None:
    parser = PodParser()
    base = pods()[0]
    for i, suffix in enumerate(("abcde", "fghij", "klmno")):
        p = _with_sa_volume(base, suffix)
        p["metadata"].update(name=f"p-{i}", uid=f"u-{i}")
        assert parser.parse(p) == parse_pod(p)
    assert parser.hits == 2


def test_a_volume_source_that_binds_to_nodes_is_refused_after_a_memoised_twin() -> None:
    parser = PodParser()
    parser.parse(_with_sa_volume(pods()[0], "abcde"))
    bad = _with_sa_volume(pods()[0], "abcde", source="persistentVolumeClaim")
    with pytest.raises(SpecError, match="persistentVolumeClaim"):
        parser.parse(bad)
    odd = copy.deepcopy(bad)
    odd["spec"]["volumes"] = [["projected"]]  # not a mapping: parse_pod's answer, no memo
    with pytest.raises(SpecError):
        parser.parse(odd)


def test_bench_unschedulable_share_fits_no_node() -> None:
    """bench_k8s --unschedulable 5: one pod in 20, by turns a nodeSelector no node matches
    and a cpu request no node has; the engine's diagnosis names that part alone."""
    from cloud_core.placement import ClusterSnapshot, Health, NodeInfo, Resources
    from cloud_core.placement.relax import diagnose
    from tools.bench_k8s import unschedulable

    picked = [i for i in range(200) if unschedulable(i, 5.0)]
    assert len(picked) == 10 and not any(unschedulable(i, 0.0) for i in range(200))
    assert [unschedulable(i, 5.0) for i in picked[:3]] == ["selector", "cpu", "selector"]
    nodes = tuple(NodeInfo(f"n{j}", "r0", "r0-a", capacity=Resources(8000, 32 << 30),
                           health=Health.ONLINE) for j in range(3))
    kinds = set()
    for i in picked[:2]:
        w = parse_pod({**pod_object(i, "ns", "cfnet-scheduler", unschedulable(i, 5.0)),
                       "metadata": {"name": f"p-{i}", "namespace": "ns", "uid": f"u{i}"}})
        d = diagnose(ClusterSnapshot(nodes, {}), w)
        kinds |= {c.kind for c in d.conflict.alone}
    assert kinds == {"node_selector", "cpu"}
