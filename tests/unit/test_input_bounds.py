"""Every input surface bounded before it is expanded, and every refusal a reason.

Unit level: the JSON loader both sides use, telemetry numbers, the console's request
parser and handler (with a hypothesis fuzz of the handler and of the workload spec
parser), the audit log's encoding, the local actuator's size budget and cfnetctl's YAML
loading and output. ``tests/integration/test_hostile_console.py`` sends the same hostile
requests to a real ``cfnet-core`` through a real broker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloud_core.actuators.local import LocalActuator, PlacementSetTooLarge, encode_placements
from cloud_core.console import cli
from cloud_core.console.context import ConsoleContext
from cloud_core.console.protocol import Request, encode_response, parse_request
from cloud_core.console.registry import CommandRegistry
from cloud_core.console.service import ConsoleService
from cloud_core.decode import ReportDecoder
from cloud_core.errors import SpecError
from cloud_core.events import EventLog
from cloud_core.ingest import Ingest
from cloud_core.placement.spec import parse_workload_yaml
from cloud_core.registry import parse_registry
from cloud_core.service import CoreConfig, CoreService
from cloud_core.state import ClusterState
from cloud_core.store import AUDIT_ARGS_MAX, Store, WorkloadRow, audit_json
from edge_agent import wire
from edge_agent.wire.mqtt import MqttSettings
from edge_agent.wire.names import name_problem, uid_problem
from tests.unit.reports import report_dict


# -- JSON and telemetry ---------------------------------------------------------------
@pytest.mark.parametrize(("payload", "reason"), [
    (b'{"a": ' + b"9" * 5000 + b"}", "range"),      # > 4300 digits: ValueError upstream
    (b'{"a": ' + b"9" * 300 + b"}", "range"),       # hundreds of digits
    (b'{"a": 1e400}', "nan"),                        # overflows a float to inf
    (b'{"a": NaN}', "nan"), (b'{"a": -Infinity}', "nan"),
    (b"[" * 100 + b"]" * 100, "schema"),             # deeper than MAX_DEPTH
    (b"[" * 200000, "malformed"),                    # recursion in the decoder
    (b"\xff\xfe", "malformed"),
])
def test_load_json_refuses_with_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(wire.WireError) as e:
        wire.load_json(payload)
    assert e.value.reason == reason


def _report_with(path: list[Any], value: Any) -> bytes:
    d = report_dict()
    o: Any = d
    for k in path[:-1]:
        o = o[k]
    o[path[-1]] = value
    return json.dumps(d).encode()


@pytest.mark.parametrize(("path", "value"), [
    (["seq"], 10**300), (["resources", "mem_total_bytes"], 10**200),
    (["ts"], 10**300), (["resources", "cpu_util"], 10**100), (["buffered"], -(10**50)),
    (["links", 0, "tx_bps"], 10**299), (["links", 0, "peer"], "10.0.0.1\x1b[2J"),
    (["seq"], 2**64), (["interval_s"], 10**30),
])
def test_telemetry_numbers_bounded(path: list[Any], value: Any) -> None:
    payload = _report_with(path, value)
    for decode in (wire.parse_report, ReportDecoder().decode):
        with pytest.raises(wire.WireError) as e:
            decode(payload, None)
        assert e.value.reason in ("range", "schema", "nan")


def test_huge_integer_is_counted_reject_not_internal() -> None:
    ing = Ingest(ClusterState(), lambda: 1000.0)
    d = report_dict()
    topic = wire.telemetry_topic(d["node"])
    got = ing.handle(topic, b'{"v": 1, "seq": ' + b"7" * 5000 + b"}")
    assert got == "rejected:range"
    assert ing.handle(topic, _report_with(["seq"], 10**400)) == "rejected:range"
    assert "internal" not in ing.counters().rejected


def test_status_labels_and_addresses_validated() -> None:
    base = {"node": "edge-a", "state": "online", "ts": 1.0, "addresses": ["10.0.0.1"],
            "labels": {"zone": "z1"}}
    wire.parse_status(json.dumps(base).encode(), "edge-a")
    for bad in ({"labels": {"zone": "\x1b[31m"}}, {"labels": {"bad key": "x"}},
                {"addresses": ["10.0.0.1; rm -rf"]}, {"labels": {"k": "v" * 64}}):
        with pytest.raises(wire.WireError):
            wire.parse_status(json.dumps({**base, **bad}).encode(), "edge-a")


# -- names --------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "ok"), [
    ("web", True), ("web-1.a_b", True), ("a" * 253, True), ("a" * 254, False), ("", False),
    ("Web", False), ("-web", False), ("web-", False), ("we b", False), ("w\x1b[2Jx", False),
    ("w/x", False), (None, False), ("ü", False),
])
def test_name_rule(value: Any, ok: bool) -> None:
    assert (name_problem(value, 253) is None) is ok


def test_uid_rule() -> None:
    assert uid_problem("default/web-1") is None
    assert uid_problem("a" * 64 + "/web") is not None
    assert uid_problem("default/web/x") is not None


@pytest.mark.parametrize("doc", [
    "name: " + "a" * 10000, "name: \"w\\e[31mred\"", "name: ok\nnamespace: Bad",
    "name: ok\nreplicas: 1000000", "name: ok\nreplicas: " + "9" * 5000,
    "name: ok\nlabels: {app: " + "x" * 100 + "}", "name: ok\nrequests: {cpu: 1e999999999}",
    "name: ok\nrequests: {cpu: 1e400}", "name: ok\ndataGb: 1.0e+400",
    "name: ok\ngang: \"g\\e[2J\"", "name: ok\nuid: \"x/y/z\"",
    "kind: Deployment\nmetadata: {name: d}\nspec: {replicas: 5000, template: {spec: "
    "{containers: [{name: c}]}}}",
])
def test_spec_parser_refuses_before_expanding(doc: str) -> None:
    with pytest.raises(SpecError):
        parse_workload_yaml(doc)


# -- console request parser and handler ------------------------------------------------
def _console(tmp_path: Path, submit: Any = None) -> tuple[ConsoleService, Store]:
    """A console with an ``echo`` command (and ``submit``, for operators, when given)."""
    store = Store(tmp_path / "c.db", lambda: 1.0)
    table = CommandRegistry()
    table.command("echo")(lambda ctx, op, args: args)
    if submit is not None:
        table.command("submit", role="operator")(submit)
    state = ClusterState()
    nothing: Any = None  # no command here reads the cluster
    ctx = ConsoleContext(nothing, state, Ingest(state), EventLog(lambda ev: None))
    svc = ConsoleService({"alice": "operator", "root": "admin"}.get, ctx,
                         commands=table.commands, audit=store.audit)
    return svc, store


def test_retained_request_refused_and_audited(tmp_path: Path) -> None:
    calls: list[Any] = []
    svc, store = _console(tmp_path, lambda ctx, op, args: calls.append(args))
    r = svc.handle_message("alice", b'{"cmd": "submit", "args": {"x": 1}}', retain=True)
    assert not r.ok and "retained" in r.error
    assert calls == []
    last = store.audit_log(1)[-1]
    assert last["cmd"] == "submit" and last["result"].startswith("refused: retained")


@pytest.mark.parametrize("payload", [
    b'{"cmd": "echo", "args": {"x": NaN}}', b'{"cmd": "echo", "args": {"x": 1e400}}',
    b"x" * 300_000, b"not json", b'{"cmd": 5}', b'{"cmd": "echo", "args": []}',
    b'{"cmd": "' + b"e" * 100 + b'"}', b'{"cmd": "echo\\u001b[2J"}',
    b'{"cmd": "echo", "args": {"n": ' + b"1" * 5000 + b"}}",
])
def test_bad_requests_answered_and_audited(tmp_path: Path, payload: bytes) -> None:
    svc, store = _console(tmp_path)
    r = svc.handle_message("alice", payload)
    assert not r.ok and r.error and "internal" not in r.error
    assert store.audit_log(1)[-1]["result"].startswith("refused: bad request")


def test_audit_args_stay_valid_json(tmp_path: Path) -> None:
    svc, store = _console(tmp_path)
    big = {"specs": [{"name": "x" * 100_000, "labels": {f"k{i}": "v" * 500 for i in range(300)}}
                     for _ in range(50)], "deep": [[[[[[[[[["x"]]]]]]]]]]}
    svc.handle("alice", Request("nope", big))
    entry = store.audit_log(1)[-1]
    assert entry["cmd"] == "nope" and isinstance(entry["args"], dict)
    assert "more chars" not in json.dumps(entry["args"])  # cut values are marked
    assert "chars)" in json.dumps(entry["args"])
    for args in (big, {"s": "é" * 10_000}, {"n": 10**100}, {"f": float("nan")}, {}):
        out = audit_json(args)
        assert len(out) <= AUDIT_ARGS_MAX
        json.loads(out)


def test_request_size_cap_is_wire_cap() -> None:
    docs = [{"name": f"w{i}", "requests": {"cpu": "100m"}} for i in range(900)]
    req = parse_request(json.dumps({"cmd": "what-if", "args": {"specs": docs}}).encode())
    assert len(req.args["specs"]) == 900


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30)

plain_keys = st.sampled_from(["name", "namespace", "uid", "replicas", "requests",
                              "nodeSelector", "nodeAffinity", "tolerations", "labels",
                              "maxLatencyMs", "latencyTo", "residency", "minSecurityLevel",
                              "dataGb", "costWeight", "gang", "podAntiAffinity"])
quantities = st.one_of(st.text(alphabet="0123456789.eE+-kKMGTPimnu ", max_size=20),
                       st.integers(), st.floats())
spec_docs = st.fixed_dictionaries(
    {"name": st.one_of(st.just("web"), st.text(max_size=20))},
    optional={"requests": st.dictionaries(st.sampled_from(["cpu", "memory",
                                                           "nvidia.com/gpu"]),
                                          quantities, max_size=3),
              "replicas": st.one_of(st.integers(), st.text(max_size=8)),
              "tolerations": st.lists(st.dictionaries(
                  st.sampled_from(["key", "operator", "value", "effect",
                                   "tolerationSeconds"]),
                  st.one_of(st.text(max_size=10), st.sampled_from(
                      ["", "Equal", "Exists", "NoSchedule", "NoExecute"]), st.integers())),
                  max_size=3),
              "nodeAffinity": st.lists(st.fixed_dictionaries({"matchExpressions": st.lists(
                  st.fixed_dictionaries({"key": st.text(max_size=10), "operator": st.sampled_from(
                      ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "x"])},
                      optional={"values": st.lists(st.text(max_size=8), max_size=3)}),
                  max_size=3)}), max_size=2)}) | st.dictionaries(plain_keys, json_values,
                                                                max_size=6)


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(doc=spec_docs)
def test_fuzz_spec_parser(doc: dict[str, Any]) -> None:
    """Any document: workloads (at most 1000) or a SpecError with field and reason."""
    try:
        ws = parse_workload_yaml(json.dumps(doc))
    except SpecError as e:
        assert e.reason
        return
    assert 0 <= len(ws) <= 1000  # replicas: 0 is zero workloads


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoreService]:
    """The real console with every real command, never connected (the handler is what is
    fuzzed; tests/integration/test_hostile_console.py runs it behind a real broker)."""
    reg = parse_registry("nodes:\n  - {name: edge-a, region: eu, zone: z1}\n")
    c = CoreService(CoreConfig(mqtt=MqttSettings(port=1), registry=reg,
                               db_path=tmp_path_factory.mktemp("fz") / "core.db",
                               roles={"vic": "viewer", "alice": "operator", "root": "admin"}))
    yield c
    c.stop()


commands = st.sampled_from(["nodes", "links", "workloads", "placements", "explain", "events",
                            "stats", "topology", "what-if", "submit", "delete", "cordon",
                            "uncordon", "drain", "audit", "nope", ""])
args_st = st.one_of(json_values, st.fixed_dictionaries(
    {"specs": st.lists(spec_docs, max_size=3)}), st.fixed_dictionaries(
    {"workload": st.text(max_size=20), "node": st.text(max_size=20),
     "limit": st.one_of(st.integers(), st.text(max_size=5))}))


@settings(max_examples=250, deadline=5000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cmd=commands, args=args_st, retain=st.booleans(), raw=st.none() | st.binary(max_size=64))
def test_fuzz_console_handler(core: CoreService, cmd: str, args: Any, retain: bool,
                              raw: bytes | None) -> None:
    """Any request, well-formed or not, from any role: an answer, never an internal error
    (hypothesis' deadline bounds the time each takes)."""
    payload = raw if raw is not None else json.dumps({"cmd": cmd, "args": args}).encode()
    for who in ("vic", "alice", "root", "mallory"):
        r = core.console.handle_message(who, payload, retain=retain)
        assert r.ok or r.error
        assert "internal error" not in r.error
        encode_response(r)  # every answer can be sent


# -- local actuator size budget -------------------------------------------------------------
def _rows(n: int, node: str = "edge-a", label: str = "") -> list[WorkloadRow]:
    return [WorkloadRow(f"default/w-{i}", f"w-{i}", "default", {"doc": {"labels": {
        "big": label}}, "index": i}, "planned", node, "", 0.0, 0.0) for i in range(n)]


def test_placement_set_carries_no_specs() -> None:
    body = json.loads(encode_placements("edge-a", _rows(10, label="x" * 60_000), 1.0))
    assert body["workloads"][0] == {"uid": "default/w-0", "name": "w-0", "namespace": "default"}
    assert len(json.dumps(body)) < 2000


def test_placement_set_over_budget_refused_with_one_event() -> None:
    sent: list[bytes] = []
    events: list[tuple[str, str]] = []

    class Ack:
        def wait(self, timeout_s: float) -> bool:
            return True

    def publish(topic: str, payload: bytes) -> Ack:
        sent.append(payload)
        return Ack()

    act = LocalActuator(publish, on_refused=lambda n, m: events.append((n, m)))
    act.apply("edge-a", _rows(3000))  # thousands on one node fit
    assert len(sent) == 1 and len(sent[0]) <= wire.MAX_PAYLOAD_BYTES
    for _ in range(3):
        with pytest.raises(PlacementSetTooLarge):
            act.apply("edge-a", _rows(6000))
    assert len(sent) == 1 and len(events) == 1
    assert "6000 workloads" in events[0][1] and "not published" in events[0][1]


# -- cfnetctl ---------------------------------------------------------------------------
def test_cli_refuses_unsafe_yaml(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, (x, y) in enumerate(zip("bcdefghi", "abcdefgh", strict=True)):
        lines.append(f"{x}: &{x} [" + ",".join([f"*{y}"] * 9) + "]")
        assert i < 9
    bomb.write_text("\n".join(lines) + "\nname: x\n")
    with pytest.raises(ValueError, match="aliases"):
        cli.read_docs(str(bomb))
    big = tmp_path / "big.yaml"
    big.write_text("name: x\nlabels: {a: '" + "x" * 300_000 + "'}\n")
    with pytest.raises(ValueError, match="larger than"):
        cli.read_docs(str(big))
    for text in ("name: x\ndataGb: .nan\n", "name: x\ndataGb: 1.0e+400\n"):
        f = tmp_path / "n.yaml"
        f.write_text(text)
        with pytest.raises(ValueError, match="not finite"):
            cli.read_docs(str(f))
    many = tmp_path / "many.yaml"
    many.write_text("\n---\n".join(yaml.safe_dump({"name": f"w{i}", "labels": {
        "a": "x" * 60, "b": "y" * 60, "c": "z" * 60}}) for i in range(1400)))
    with pytest.raises(ValueError, match="bytes"):
        cli.read_docs(str(many))


def test_cli_output_has_no_control_characters() -> None:
    rows = [{"uid": "u", "namespace": "d", "name": "w\x1b]0;pwned\x07", "state": "placed",
             "node": "n\x1b[2J", "reason": "r\u202eevil", "age_s": 1}]
    out = cli.printable(cli.emit("table", "workloads", rows))
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    ev = cli.printable(cli.render_event({"ts": 0, "message": "m\x1b[31m\r", "kind": "k"}))
    assert "\x1b" not in ev and "\r" not in ev


def test_event_text_bounded() -> None:
    from cloud_core.events import MAX_EVENT_MESSAGE, EventLog

    sent: list[bytes] = []
    log = EventLog(lambda ev: sent.append(ev.encode()), lambda: 1.0)
    ev = log.emit("placement", "unplaceable: " + "reason; " * 100_000)
    assert len(ev.message) < MAX_EVENT_MESSAGE + 20 and ev.message.endswith(")")
    assert len(sent[0]) < wire.MAX_PAYLOAD_BYTES


def test_audit_rows_written_cut_before_still_read(tmp_path: Path) -> None:
    """Entries an older core cut mid-JSON (the bug this fixes) read back, not crash."""
    store = Store(tmp_path / "old.db", lambda: 1.0)
    store.audit(1.0, "alice", "submit", {"specs": []}, "ok")
    with store._lock:  # writing the old, broken form directly
        store._db.execute("INSERT INTO audit (ts, operator, cmd, args, result) "
                          "VALUES (2.0, 'alice', 'submit', ?, 'ok')", ('{"specs": ["x',))
    log = store.audit_log(10)
    assert log[0]["args"] == {"specs": []}
    assert log[1]["args"] == {"unreadable": '{"specs": ["x'}
