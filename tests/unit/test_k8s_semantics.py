"""Kubernetes semantics, table-driven: quantities, label selectors, node affinity, tolerations.

Every group names the upstream file its cases come from (kubernetes/kubernetes, staging
paths shortened to the module). Each case states what Kubernetes answers; cfnet must agree.
Where cfnet deliberately differs (it refuses an exponent outside int32 that Go would wrap)
the case says so.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from cloud_core.errors import SpecError
from cloud_core.placement import quantity
from cloud_core.placement.filters import STATIC_FILTERS, requirement_matches, tolerates
from cloud_core.placement.model import (
    ClusterSnapshot,
    NodeInfo,
    NodeSelectorRequirement,
    Taint,
    Toleration,
    node_label,
)
from cloud_core.placement.spec import parse_pod
from cloud_core.placement.spec_values import parse_quantity
from cloud_core.placement.validate import validate
from tests.unit.agreement import fitting_nodes

MAX = 2**63 - 1


def _nano(text: str) -> int:
    """The parsed value in nano units after Kubernetes' round-up-to-nano (exact fraction)."""
    q = quantity.parse(text)
    x = Fraction(q.mantissa * 2**q.exp2) * Fraction(10) ** q.exp10 * 10**9
    n = -(-x.numerator // x.denominator)
    return -n if q.negative else n


# -- k8s.io/apimachinery/pkg/api/resource/quantity_test.go: TestQuantityParse -------------
# (input, value as decQuantity(mantissa, exponent)) -> nano units
PARSE_TABLE = [
    ("0", 0, 0), ("0n", 0, 0), ("0u", 0, 0), ("0m", 0, 0), ("0Ki", 0, 0), ("0k", 0, 0),
    ("0Mi", 0, 0), ("0M", 0, 0), ("0Gi", 0, 0), ("0G", 0, 0), ("0Ti", 0, 0), ("0T", 0, 0),
    ("1", 1, 0),
    ("1Ki", 1024, 0), ("8Ki", 8 * 1024, 0), ("7Mi", 7 * 2**20, 0), ("6Gi", 6 * 2**30, 0),
    ("5Ti", 5 * 2**40, 0), ("4Pi", 4 * 2**50, 0), ("10Ti", 10 * 2**40, 0),
    ("100Ti", 100 * 2**40, 0),
    ("5n", 5, -9), ("4u", 4, -6), ("3m", 3, -3), ("9", 9, 0), ("8k", 8, 3), ("50k", 5, 4),
    ("7M", 7, 6), ("6G", 6, 9),
    ("1E-3", 1, -3), ("1e3", 1, 3), ("1E6", 1, 6), ("1e9", 1, 9),
    ("1e14", 1, 14), ("1e13", 1, 13), ("100.035k", 100035, 0),
    ("0.001", 1, -3), ("0.0005k", 5, -1), ("0.005", 5, -3), ("0.05", 5, -2), ("0.5", 5, -1),
    ("0.00050k", 5, -1), ("0.00500", 5, -3), ("0.05000", 5, -2), ("0.50000", 5, -1),
    ("0.5e0", 5, -1), ("0.5e-1", 5, -2), ("0.5e-2", 5, -3), ("10.035M", 10035, 3),
    ("1.2e3", 12, 2), ("1.3E+6", 13, 5), ("1.40e9", 14, 8),
    ("9.01", 901, -2), ("8.1k", 81, 2), ("7.123456M", 7123456, 0),
    ("6.987654321G", 6987654321, 0),
    # things that saturate / round (up to the next nano unit)
    ("3.001n", 4, -9), ("1.1E-9", 2, -9), ("0.0000000001", 1, -9), ("0.0000000005", 1, -9),
    ("0.00000000050", 1, -9), ("0.5e-9", 1, -9), ("0.9n", 1, -9),
    ("0.00000012345", 124, -9), ("0.00000012354", 124, -9),
    # fractional binary
    ("100.035Ki", 10243584, -2), ("0.5Mi", 2**19, 0), ("0.05Gi", 536870912, -1),
    # "things written by trolls"
    ("0.000000000001Ki", 2, -9), (".001", 1, -3), (".0001k", 100, -3), ("1.", 1, 0),
    ("1.G", 1, 9),
]


@pytest.mark.parametrize(("text", "mant", "exp"), PARSE_TABLE)
def test_parse_quantity_table(text: str, mant: int, exp: int) -> None:
    want = mant * 10 ** (exp + 9) if exp + 9 >= 0 else None
    assert want is not None
    assert _nano(text) == want
    # the same with an explicit sign, as the upstream test repeats every case
    assert _nano("+" + text) == want
    assert _nano("-" + text) == -want


# quantity_test.go: TestQuantityParse "invalid", plus trailing/leading space (ParseQuantity
# forbids it; UnmarshalJSON trims, see test_json_trims_spaces)
@pytest.mark.parametrize("text", ["1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i",
                                  "-3.01i", "-3.01e-", " 1", "1 ", "", "1K", "1e", "1e+",
                                  "1ki", "1KI", "0x10", "1e3.5", "1Mi3", "1_000", "１"])
def test_invalid_quantities(text: str) -> None:
    with pytest.raises(quantity.QuantityError):
        quantity.parse(text)


# quantity_test.go: TestParseQuantityString ("." and "-." are zero)
@pytest.mark.parametrize("text", [".", "-.", "+", "-", "000", "0.000", "-0"])
def test_degenerate_zero(text: str) -> None:
    assert _nano(text) == 0
    assert parse_quantity(text, "f", "cpu") == 0


# quantity.go ParseQuantity: BinarySI is capped at MaxInt64 ("9Ei", "9223372036854775807Ki")
@pytest.mark.parametrize("text", ["9Ei", "9223372036854775807Ki", "8Ei", "100Ei"])
def test_binary_si_capped(text: str) -> None:
    assert parse_quantity(text, "f", "mem") == MAX


# quantity.go: MilliValue = ceil(q * 1000), Value = ceil(q). CPU is counted in millicores
# (MilliValue), memory in bytes (Value); canonical sub-millicore forms the API server
# writes ("500u", "1n") are accepted and round up.
MILLI = [
    ("1", 1000), ("100m", 100), ("0.1", 100), ("1.5", 1500), ("500u", 1), ("1n", 1),
    ("1500u", 2), ("999999n", 1), ("1000001n", 2), ("0.0001", 1), ("2.0001", 2001),
    ("0.30000000000000004", 301), ("1e-3", 1), ("1e-12", 1), ("1e-999999999", 1),
    ("9223372036854775807m", MAX), ("1Ki", 1024000), ("0", 0), ("12e-1", 1200),
]


@pytest.mark.parametrize(("text", "milli"), MILLI)
def test_cpu_millivalue_rounds_up(text: str, milli: int) -> None:
    assert parse_quantity(text, "f", "cpu") == milli


VALUE = [("1", 1), ("1.5", 2), ("0.1", 1), ("100m", 1), ("1Ki", 1024), ("1.5Gi", 3 * 2**29),
         ("128974848", 128974848), ("129e6", 129000000), ("129M", 129000000),
         ("123Mi", 123 * 2**20), ("1E", 10**18), ("7Ei", 7 * 2**60),
         ("966367641600m", 966367642)]


@pytest.mark.parametrize(("text", "value"), VALUE)
def test_memory_value_rounds_up(text: str, value: int) -> None:
    assert parse_quantity(text, "f", "mem") == value


# Overflow of MilliValue/Value is "undefined" upstream: cfnet refuses with a reason, fast
@pytest.mark.parametrize(("text", "kind"), [
    ("1e999999999", "cpu"), ("1e999999999", "mem"), ("1e400", "cpu"), ("1e400", "mem"),
    ("9223372036854775808m", "cpu"), ("9.3e15", "cpu"), ("1E", "cpu"), ("8Ei", "cpu"),
    ("1" + "0" * 5000, "mem"), ("9223372036854775808", "mem"), ("2147483647e2147483647", "cpu"),
])
def test_too_large_refused(text: str, kind: str) -> None:
    # computed exactly, 1e999999999 would take hours and GiBs; the suite would hang here
    with pytest.raises(SpecError, match="too large"):
        parse_quantity(text, "f", kind)


# cfnet's one deliberate difference: Go truncates an exponent to int32 (so 1e4294967296 is
# 1); cfnet refuses it. Exponents beyond int64 are ErrSuffix upstream too.
@pytest.mark.parametrize("text", ["1e4294967296", "1e-2147483649", "1e99999999999999999999"])
def test_exponent_outside_int32_refused(text: str) -> None:
    with pytest.raises(SpecError, match="exponent"):
        parse_quantity(text, "f", "cpu")


# pkg/apis/core/validation: ValidateNonnegativeQuantity; extended resources must be integers
@pytest.mark.parametrize(("value", "kind"), [("-1", "cpu"), ("-100m", "cpu"), ("-1Ki", "mem"),
                                             ("0.5", "count"), ("1500m", "count")])
def test_validation_refuses(value: str, kind: str) -> None:
    with pytest.raises(SpecError):
        parse_quantity(value, "f", kind)


@pytest.mark.parametrize(("value", "want"), [(" 2 ", 2000), (2, 2000), (0.5, 500),
                                             ("\t1m\n", 1)])
def test_json_trims_spaces(value: Any, want: int) -> None:
    # Quantity.UnmarshalJSON: strings.TrimSpace, and a JSON number is its own text
    assert parse_quantity(value, "f", "cpu") == want


@pytest.mark.parametrize("value", [float("inf"), float("nan"), True, None, [1], {"a": 1},
                                   10**200])
def test_non_quantities(value: Any) -> None:
    with pytest.raises(SpecError):
        parse_quantity(value, "f", "cpu")


# -- k8s.io/apimachinery/pkg/labels/selector_test.go: TestRequirementMatches (Gt/Lt via
# strconv.ParseInt on both sides; absent key never matches Gt/Lt/In/Exists) -----------
def _req(op: str, *values: str) -> NodeSelectorRequirement:
    return NodeSelectorRequirement("k", op, values)


REQUIREMENTS = [
    (_req("In", "a", "b"), "a", True), (_req("In", "a"), "c", False),
    (_req("In", "a"), None, False), (_req("In", ""), "", True), (_req("In", ""), None, False),
    (_req("NotIn", "a"), "b", True), (_req("NotIn", "a"), "a", False),
    (_req("NotIn", "a"), None, True), (_req("NotIn", ""), "", False),
    (_req("Exists"), "", True), (_req("Exists"), "x", True), (_req("Exists"), None, False),
    (_req("DoesNotExist"), None, True), (_req("DoesNotExist"), "", False),
    (_req("Gt", "1"), "2", True), (_req("Gt", "2"), "2", False), (_req("Gt", "2"), "1", False),
    (_req("Lt", "2"), "1", True), (_req("Lt", "1"), "1", False),
    (_req("Gt", "-5"), "-4", True), (_req("Lt", "-4"), "-5", True),
    (_req("Gt", "1"), None, False), (_req("Lt", "1"), None, False),
    (_req("Gt", "0"), "+1", True),         # ParseInt takes a leading '+'
    (_req("Gt", "0"), " 1", False),        # no spaces (Python's int() takes them)
    (_req("Gt", "0"), "1_000", False),     # no underscores in base 10
    (_req("Gt", "0"), "٣", False),         # no non-ASCII digits
    (_req("Gt", "0"), "1.5", False), (_req("Gt", "0"), "", False),
    (_req("Gt", "0"), "9223372036854775808", False),   # out of int64: parse error
    (_req("Lt", "0"), "-9223372036854775808", True),   # MinInt64 parses
    (_req("Gt", "9223372036854775806"), "9223372036854775807", True),
    (_req("Gt", "0"), "0x10", False), (_req("Gt", "0"), "007", True),
]


@pytest.mark.parametrize(("req", "value", "want"), REQUIREMENTS)
def test_requirement_matches(req: NodeSelectorRequirement, value: str | None,
                             want: bool) -> None:
    assert requirement_matches(req, value) is want


# -- k8s.io/component-helpers/scheduling/corev1/nodeaffinity/nodeaffinity_test.go and
# k8s.io/component-helpers/scheduling/corev1/helpers_test.go (MatchNodeSelectorTerms):
# terms ORed, expressions ANDed, an empty term matches nothing, absent labels absent.
ZONE = "topology.kubernetes.io/zone"
SEC = "cfnet.io/security-level"


def _node(**labels: str) -> NodeInfo:
    return NodeInfo(name="n1", region="", zone="", labels=labels)


def _filter(name: str, spec: dict[str, Any], node: NodeInfo) -> bool:
    """The engine's filter's answer; the independent validator (validate.py, which the core
    runs before acting) and ``explain`` must give the same one (tests/unit/agreement.py)."""
    pod = {"kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c"}], **spec}}
    w = parse_pod(pod)
    f = next(f for f in STATIC_FILTERS if f.name == name)
    ok = f(w, node) is None
    snap = ClusterSnapshot(nodes=(node,), links={})
    violations = [v for v in validate(snap, [w], {w.uid: node.name})
                  if v.constraint == name]
    assert (not violations) is ok, (name, violations)
    # and explain says the same of the node (the whole verdict: nothing else fails here)
    assert (node.name in fitting_nodes(snap, w)) is ok, name
    return ok


def _aff(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def _expr(key: str, op: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


AFFINITY = [
    # (terms, node labels, matches)
    ([{"matchExpressions": [_expr("foo", "In", "bar", "value2")]}], {"foo": "bar"}, True),
    ([{"matchExpressions": [_expr("foo", "In", "bar")]}], {"foo": "baz"}, False),
    ([{"matchExpressions": [_expr("foo", "In", "bar")]}], {}, False),
    ([{"matchExpressions": [_expr("foo", "NotIn", "bar")]}], {}, True),
    ([{"matchExpressions": [_expr("foo", "NotIn", "bar")]}], {"foo": "bar"}, False),
    ([{"matchExpressions": [_expr("foo", "Exists")]}], {"foo": ""}, True),
    ([{"matchExpressions": [_expr("foo", "Exists")]}], {}, False),
    ([{"matchExpressions": [_expr("foo", "DoesNotExist")]}], {}, True),
    ([{"matchExpressions": [_expr("foo", "DoesNotExist")]}], {"foo": "x"}, False),
    ([{"matchExpressions": [_expr("kernel-version", "Gt", "0204")]}],
     {"kernel-version": "0206"}, True),
    ([{"matchExpressions": [_expr("mem-type", "NotIn", "DDR", "DDR2")]}],
     {"mem-type": "DDR3"}, True),
    ([{"matchExpressions": [_expr("GPU", "Exists")]}], {"GPU": "NVIDIA-GRID-K1"}, True),
    ([{"matchExpressions": [_expr("foo", "In", "bar"), _expr("baz", "Exists")]}],
     {"foo": "bar"}, False),  # ANDed
    ([{"matchExpressions": [_expr("foo", "In", "bar")]},
      {"matchExpressions": [_expr("diffkey", "In", "wrong", "value2")]}],
     {"foo": "bar"}, True),  # ORed
    ([{"matchExpressions": [_expr("foo", "In", "x")]},
      {"matchExpressions": [_expr("diffkey", "In", "wrong", "value2")]}],
     {"diffkey": "value2"}, True),
    ([{}], {"foo": "bar"}, False),  # an empty term matches nothing
    ([{}, {"matchExpressions": [_expr("foo", "Exists")]}], {"foo": "bar"}, True),
    ([{"matchFields": [_expr("metadata.name", "In", "n1")]}], {}, True),
    ([{"matchFields": [_expr("metadata.name", "In", "n2")]}], {}, False),
    ([{"matchFields": [_expr("metadata.name", "NotIn", "n2")]}], {}, True),
    ([{"matchFields": [_expr("metadata.name", "In", "n1")],
       "matchExpressions": [_expr("foo", "In", "x")]}], {"foo": "y"}, False),
    # absent topology / security labels are absent (edge nodes often have no zone)
    ([{"matchExpressions": [_expr(ZONE, "Exists")]}], {}, False),
    ([{"matchExpressions": [_expr(ZONE, "DoesNotExist")]}], {}, True),
    ([{"matchExpressions": [_expr(ZONE, "NotIn", "z1")]}], {}, True),
    ([{"matchExpressions": [_expr(ZONE, "In", "z1")]}], {ZONE: "z1"}, True),
    ([{"matchExpressions": [_expr(SEC, "Exists")]}], {}, False),
    ([{"matchExpressions": [_expr(SEC, "Gt", "-1")]}], {}, False),
    ([{"matchExpressions": [_expr(SEC, "Gt", "1")]}], {SEC: "2"}, True),
    ([{"matchExpressions": [_expr(SEC, "Lt", "1")]}], {SEC: "high"}, False),
]


@pytest.mark.parametrize(("terms", "labels", "want"), AFFINITY)
def test_required_node_affinity(terms: list[dict[str, Any]], labels: dict[str, str],
                                want: bool) -> None:
    assert _filter("node_affinity", _aff(*terms), _node(**labels)) is want


# k8s.io/component-helpers/.../nodeaffinity_test.go TestRequiredNodeAffinity (nodeSelector)
# with labels.SelectorFromSet: the key must be present with exactly that value
NODE_SELECTOR = [
    ({"foo": "bar"}, {"foo": "bar"}, True), ({"foo": "bar"}, {"foo": "baz"}, False),
    ({"foo": "bar"}, {}, False), ({"foo": ""}, {}, False), ({"foo": ""}, {"foo": ""}, True),
    ({ZONE: ""}, {}, False), ({"a": "1", "b": "2"}, {"a": "1"}, False),
    ({"a": "1", "b": "2"}, {"a": "1", "b": "2", "c": "3"}, True), ({}, {}, True),
]


@pytest.mark.parametrize(("sel", "labels", "want"), NODE_SELECTOR)
def test_node_selector(sel: dict[str, str], labels: dict[str, str], want: bool) -> None:
    assert _filter("node_selector", {"nodeSelector": sel}, _node(**labels)) is want


def test_node_label_absent_is_none() -> None:
    n = NodeInfo(name="n", region="", zone="")
    assert node_label(n, ZONE) is None
    assert node_label(n, SEC) is None
    assert node_label(NodeInfo(name="n", region="r", zone="z", security_level=2), SEC) == "2"


# pkg/apis/core/validation/validation.go (ValidateNodeSelector / validateNodeSelectorTerm /
# ValidateNodeFieldSelectorRequirement) and labels.NewRequirement: forms the API server
# never stores are refused, not dropped
INVALID_AFFINITY = [
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": []}}}},
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
    _aff({"matchExpressions": [_expr("foo", "In")]}),
    _aff({"matchExpressions": [_expr("foo", "NotIn")]}),
    _aff({"matchExpressions": [_expr("foo", "Exists", "x")]}),
    _aff({"matchExpressions": [_expr("foo", "DoesNotExist", "x")]}),
    _aff({"matchExpressions": [_expr("foo", "Gt")]}),
    _aff({"matchExpressions": [_expr("foo", "Gt", "1", "2")]}),
    _aff({"matchExpressions": [_expr("foo", "Gt", "1.5")]}),
    _aff({"matchExpressions": [_expr("foo", "Lt", " 1")]}),
    _aff({"matchExpressions": [_expr("foo", "Lt", "99999999999999999999")]}),
    _aff({"matchExpressions": [_expr("foo", "Matches", "x")]}),
    _aff({"matchExpressions": [_expr("-bad-key-", "Exists")]}),
    _aff({"matchExpressions": [_expr("foo", "In", "bad value")]}),
    _aff({"matchExpressions": [_expr("foo", "In", "x" * 64)]}),
    _aff({"matchFields": [_expr("metadata.name", "Exists")]}),
    _aff({"matchFields": [_expr("metadata.name", "In", "a", "b")]}),
    _aff({"matchFields": [_expr("metadata.labels", "In", "a")]}),
    {"nodeSelector": {"bad key!": "x"}},
    {"nodeSelector": {"foo": "x" * 64}},
]


@pytest.mark.parametrize("spec", INVALID_AFFINITY)
def test_invalid_affinity_refused(spec: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        _filter("node_affinity", spec, _node())


# metav1.LabelSelector (pod affinity selectors) has no Gt/Lt:
# apimachinery/pkg/apis/meta/v1/helpers.go LabelSelectorAsSelector
@pytest.mark.parametrize("op", ["Gt", "Lt"])
def test_pod_label_selector_has_no_gt_lt(op: str) -> None:
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c"}], "affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchExpressions": [_expr("a", op, "1")]}}]}}}}
    with pytest.raises(SpecError, match="operator"):
        parse_pod(pod)


# -- k8s.io/api/core/v1/toleration_test.go: TestTolerationToleratesTaint -----------------
TOLERATIONS = [
    (Toleration("", "Exists", "", ""), Taint("foo", "bar", "NoSchedule"), True),
    (Toleration("", "Exists", "", ""), Taint("x", "", "NoExecute"), True),
    (Toleration("foo", "Exists", "", ""), Taint("foo", "bar", "NoSchedule"), True),
    (Toleration("foo", "Exists", "", "NoSchedule"), Taint("foo", "bar", "NoExecute"), False),
    (Toleration("foo", "Equal", "bar", "NoSchedule"), Taint("foo", "bar", "NoSchedule"), True),
    (Toleration("foo", "Equal", "bar", ""), Taint("foo", "bar", "NoExecute"), True),
    (Toleration("foo", "Equal", "bar", ""), Taint("foo", "baz", "NoSchedule"), False),
    (Toleration("foo", "", "bar", ""), Taint("foo", "bar", "NoSchedule"), True),  # "" = Equal
    (Toleration("foo", "", "", ""), Taint("foo", "", "NoSchedule"), True),
    (Toleration("foo", "Equal", "", ""), Taint("foo", "bar", "NoSchedule"), False),
    (Toleration("other", "Exists", "", ""), Taint("foo", "bar", "NoSchedule"), False),
    (Toleration("", "Exists", "", "NoExecute"), Taint("foo", "bar", "NoSchedule"), False),
    (Toleration("foo", "Equal", "bar", "PreferNoSchedule"),
     Taint("foo", "bar", "NoSchedule"), False),
    (Toleration("foo", "Bogus", "bar", ""), Taint("foo", "bar", "NoSchedule"), False),
]


@pytest.mark.parametrize(("tol", "taint", "want"), TOLERATIONS)
def test_toleration_tolerates_taint(tol: Toleration, taint: Taint, want: bool) -> None:
    assert tolerates(tol, taint) is want


def _taint_filter(tols: list[dict[str, Any]], taints: tuple[Taint, ...]) -> bool:
    node = NodeInfo(name="n1", region="", zone="", taints=taints)
    return _filter("taints", {"tolerations": tols}, node)


# pkg/apis/core/validation validateTolerations: parse-level cases
def test_empty_operator_is_equal() -> None:
    t = (Taint("dedicated", "gpu", "NoSchedule"),)
    assert _taint_filter([{"key": "dedicated", "operator": "", "value": "gpu"}], t)
    assert _taint_filter([{"key": "dedicated", "value": "gpu"}], t)
    assert not _taint_filter([{"key": "dedicated", "value": "cpu"}], t)
    # PreferNoSchedule never repels (scheduler's TaintToleration filter)
    assert _taint_filter([], (Taint("x", "", "PreferNoSchedule"),))


@pytest.mark.parametrize("tol", [
    {"operator": "Equal", "value": "x"},          # empty key needs Exists
    {"key": "k", "operator": "Exists", "value": "v"},  # Exists takes no value
    {"key": "k", "operator": "In"},
    {"key": "k", "effect": "NoRun"},
    {"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5},
    {"key": "bad key"},
    {"key": "k", "value": "bad value"},
])
def test_invalid_tolerations_refused(tol: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        _taint_filter([tol], ())


def test_case_count() -> None:
    """The issue asks for at least 150 cases drawn from the Kubernetes specification."""
    n = (len(PARSE_TABLE) + 22 + 7 + 4 + len(MILLI) + len(VALUE) + 11 + 3 + 5 + 4 + 7
         + len(REQUIREMENTS) + len(AFFINITY) + len(NODE_SELECTOR) + len(INVALID_AFFINITY)
         + 2 + len(TOLERATIONS) + 7)
    assert n >= 150
