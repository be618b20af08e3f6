"""The console's one command registry: every command has a role and bounds, declared beside
it, and a request outside them is refused with the reason before the command runs.

Table-driven over the real registry and a real (never connected) core: unknown command,
wrong role and each kind of out-of-bounds argument, for every command that declares it.
The same console behind a real broker: tests/integration/test_console.py and
test_hostile_console.py; the Kubernetes cluster's commands: tests/k8s/test_console_k8s.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloud_core.console.commands import COMMANDS
from cloud_core.console.protocol import Request, Response
from cloud_core.console.registry import (
    MAX_DOC_BYTES,
    MAX_SUBMIT,
    NAME_ARG_MAX,
    ROLES,
    Bounds,
    CommandRegistry,
)
from cloud_core.registry import parse_registry
from cloud_core.service import CoreConfig, CoreService
from edge_agent.wire.mqtt import MqttSettings

NODE, WORKLOAD = Bounds(names=("node",)), Bounds(names=("workload", "namespace"))
SPECS = Bounds(specs=MAX_SUBMIT)
# name -> (least role, bounds): the whole console, so that a change to it is deliberate
EXPECTED = {
    "nodes": ("viewer", Bounds()), "links": ("viewer", NODE),
    "workloads": ("viewer", Bounds(paged=True)), "placements": ("viewer", Bounds()),
    "explain": ("viewer", WORKLOAD), "events": ("viewer", Bounds(limit=(1, 2000))),
    "stats": ("viewer", Bounds()), "received": ("viewer", NODE),
    "topology": ("viewer", Bounds()), "what-if": ("viewer", SPECS),
    "submit": ("operator", SPECS), "delete": ("operator", WORKLOAD),
    "cordon": ("operator", NODE), "uncordon": ("operator", NODE), "drain": ("operator", NODE),
    "audit": ("admin", Bounds(limit=(1, 1000))),
}
WHO = {"viewer": "vic", "operator": "alice", "admin": "root"}


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoreService]:
    reg = parse_registry("nodes:\n  - {name: edge-a, region: eu, zone: z1}\n")
    c = CoreService(CoreConfig(mqtt=MqttSettings(port=1), registry=reg,
                               db_path=tmp_path_factory.mktemp("reg") / "core.db",
                               roles={v: k for k, v in WHO.items()}))
    yield c
    c.stop()


def ask(core: CoreService, who: str, cmd: str, **args: Any) -> Response:
    return core.console.handle(who, Request(cmd, args))


def test_every_command_declares_a_role_and_bounds() -> None:
    assert {n: (c.role, c.bounds) for n, c in COMMANDS.items()} == EXPECTED
    for c in COMMANDS.values():
        assert c.role in ROLES and isinstance(c.bounds, Bounds) and c.help


def test_a_name_is_registered_once_and_a_role_must_be_known() -> None:
    table = CommandRegistry()
    table.command("x")(lambda ctx, op, args: None)
    with pytest.raises(ValueError, match="registered twice"):
        table.command("x")(lambda ctx, op, args: None)
    with pytest.raises(ValueError, match="unknown role"):
        table.command("y", role="root")
    with pytest.raises(TypeError):  # read-only once declared
        table.commands["z"] = table.commands["x"]  # type: ignore[index]


def test_an_unknown_command_is_refused_naming_the_known_ones(core: CoreService) -> None:
    r = ask(core, "root", "reboot")
    assert not r.ok and "unknown command 'reboot'" in r.error
    assert all(name in r.error for name in COMMANDS)


@pytest.mark.parametrize("cmd", [n for n, (role, _b) in EXPECTED.items() if role != "viewer"])
def test_each_command_refuses_the_roles_below_its_own(core: CoreService, cmd: str) -> None:
    need = COMMANDS[cmd].role
    for role in ROLES[:ROLES.index(need)]:
        r = ask(core, WHO[role], cmd, node="edge-a", workload="w", limit=1)
        assert not r.ok and f"needs role {need!r}" in r.error and f"is {role!r}" in r.error
    r = ask(core, "mallory", cmd)
    assert not r.ok and "has no role on this core" in r.error


def _out_of_bounds(b: Bounds) -> list[tuple[dict[str, Any], str]]:
    """Arguments outside ``b``, each with (a part of) the refusal's reason."""
    out: list[tuple[dict[str, Any], str]] = []
    for name in b.names:
        out.append(({name: "n" * (NAME_ARG_MAX + 1)},
                    f"{name}: {NAME_ARG_MAX + 1} characters, more than {NAME_ARG_MAX}"))
    if b.limit is not None:
        lo, hi = b.limit
        why = f"limit must be an integer within {lo}..{hi}"
        out += [({"limit": v}, why) for v in (lo - 1, hi + 1, "5", True, None, 2.5)]
    if b.paged:
        out += [({"offset": -1}, "offset must be a non-negative integer"),
                ({"limit": "3"}, "limit must be a non-negative integer"),
                ({"limit": True}, "limit must be a non-negative integer"),
                ({"total": "yes"}, "total must be true or false")]
    if b.specs:
        doc = {"name": "w", "requests": {"cpu": "10m"}}
        out += [({}, "expected 'specs': a non-empty list"),
                ({"specs": []}, "expected 'specs': a non-empty list"),
                ({"specs": {"name": "w"}}, "expected 'specs': a non-empty list"),
                ({"specs": [doc, 7]}, "document 2: must be a mapping"),
                ({"specs": [doc] * (b.specs + 1)}, f"at most {b.specs} workloads per request"),
                ({"specs": [{"name": "w", "x": "y" * MAX_DOC_BYTES}]},
                 f"more than the {MAX_DOC_BYTES} one workload document may have")]
    return out


CASES = [(cmd, args, why) for cmd, (_r, b) in EXPECTED.items() for args, why in _out_of_bounds(b)]


@pytest.mark.parametrize(("cmd", "args", "why"), CASES,
                         ids=[f"{c}-{'-'.join(a) or 'none'}-{i}"
                              for i, (c, a, _w) in enumerate(CASES)])
def test_out_of_bounds_arguments_are_refused_with_the_reason(
        core: CoreService, cmd: str, args: dict[str, Any], why: str) -> None:
    before = len(core.store.workloads())
    r = ask(core, "root", cmd, **args)
    assert not r.ok and why in r.error, r.error
    assert len(core.store.workloads()) == before  # the command did not run
    assert core.store.audit_log(1)[-1]["result"] == f"error: {r.error}"


def test_every_bounded_command_has_an_out_of_bounds_case() -> None:
    bounded = {c for c, (_r, b) in EXPECTED.items() if b != Bounds()}
    assert {c for c, _a, _w in CASES} == bounded
    assert bounded >= {"links", "workloads", "explain", "events", "received", "what-if",
                       "submit", "delete", "cordon", "uncordon", "drain", "audit"}


@pytest.mark.parametrize(("cmd", "args"), [
    ("events", {"limit": 1}), ("events", {"limit": 2000}), ("audit", {"limit": 1000}),
    ("workloads", {"offset": 0, "limit": 0, "total": True}), ("links", {"node": None}),
    ("what-if", {"specs": [{"name": "w", "requests": {"cpu": "10m"}}]}),
    ("cordon", {"node": "edge-a"}), ("uncordon", {"node": "edge-a"}),
])
def test_arguments_within_bounds_reach_the_command(
        core: CoreService, cmd: str, args: dict[str, Any]) -> None:
    r = ask(core, "root", cmd, **args)
    assert r.ok, r.error


class _RecordingCluster:
    """A cluster whose answers name it (the Kubernetes mode's place in these commands)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def answer(*args: Any) -> Any:
            self.calls.append(name)
            return {"from": "recording"} if name != "placements" else {}
        return answer


def test_the_clusters_commands_answer_from_the_cluster_the_context_holds(
        tmp_path: Path) -> None:
    c = CoreService(CoreConfig(mqtt=MqttSettings(port=1), db_path=tmp_path / "core.db",
                               roles={"root": "admin"}))
    try:
        local_nodes = ask(c, "root", "nodes")
        assert local_nodes.ok and local_nodes.data == []
        cluster = _RecordingCluster()
        c.console.use_cluster(cluster)  # type: ignore[arg-type]
        for cmd, args in (("nodes", {}), ("workloads", {}), ("explain", {"workload": "w"}),
                          ("cordon", {"node": "n"}), ("drain", {"node": "n"}),
                          ("submit", {"specs": [{"name": "w"}]})):
            r = ask(c, "root", cmd, **args)
            assert r.ok and r.data == {"from": "recording"}, (cmd, r.error)
        assert cluster.calls == ["nodes", "workloads", "explain", "cordon", "drain", "submit"]
        # the core's own commands stay the core's: measured links, counters, the audit log
        assert ask(c, "root", "stats").data["accepted"] == 0
        assert ask(c, "root", "audit", limit=3).ok
        assert c.console.commands is COMMANDS  # one registry in both modes
    finally:
        c.stop()
