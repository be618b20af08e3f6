"""Reaction on Kubernetes, per stage: a measured link degradation to the replacement's binding.

The deployed path: ``cfnet-core --kubernetes``'s wiring (``cloud_core.k8s.wiring.
start_kubernetes``: the decision loop with the Kubernetes actuator, Lease election, MQTT ingest
while leading) on a real control plane (etcd, kube-apiserver, kube-controller-manager: the
ReplicaSet controller makes the replacement) with kwok running three Nodes, fed by real
``cfnet-agent`` processes (eBPF probe, 1 s interval) in a network lab, one per Node's site:
``edgea`` and ``edgeb`` can run the workload, ``users`` is where its users are (``edge-u``,
cordoned). Bounded paced TCP flows run both ways between ``users`` and each candidate, so every
agent measures RTTs on those links (kernel-measured, not reported figures).

A one-replica Deployment asks for ``cfnet.io/max-latency-ms`` (20 ms) to ``edge-u``. Per run,
the link of the site its pod runs on is cut to ``--degraded-mbit`` (tbf, both directions), the
flows queue and the RTT climbs past the SLA. Each stage's moment on this machine's clock (one
clock: the namespaces share it):

1. degradation applied (``tc`` returned);
2. the agent's window crosses the SLA: the agent's own timestamp (``report_ts``) of the first
   report whose p95 is over the SLA, for the later of the link's two directions (the engine
   takes the better direction, so the violation counts once both agree);
3. that report in the core's state (``LinkView.updated``: the core's time of the sample);
4. the loop's decision (``commit_moves`` entered: ``plan_moves`` returned a move);
5. the eviction answered by the API server (``commit_moves`` returned);
6. the replacement pod created by the ReplicaSet controller (seen by polling the API, 50 ms);
7. the replacement bound by cfnet (``spec.nodeName``);
8. the replacement Running (kwok: at once; a real kubelet adds the container start, see
   tests/cluster/test_demo_k8s.py).

The loop's ``commit_moves`` is wrapped here to time stages 4 and 5 (the product emits its
``move`` event only after the eviction). Settings as ``tools.bench_reaction`` (local mode):
``ReplanConfig`` defaults but ``cooldown_s`` ``--cooldown`` (3 s), so the table compares.

    python -m tools.bench_reaction --kubernetes [--runs 10]  # = python -m tools.bench_reaction_k8s
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.registry import AGENT_ID, RESIDENCY_REGION, SECURITY
from cloud_core.k8s.wiring import KubeRunner, KubeSettings, start_kubernetes
from cloud_core.placement import ReplanConfig
from cloud_core.service import CoreConfig, CoreService
from edge_agent.wire.mqtt import MqttSettings
from tools.broker import Broker
from tools.lab import Lab, SiteSpec
from tools.netns import in_netns
from tools.outage_rig import wait_until
from tools.procs import stop_all
from tools.stats import pct

log = logging.getLogger("tools.bench_reaction_k8s")

VENV_BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
SITES = {"edge-a": "edgea", "edge-b": "edgeb", "edge-u": "users"}
USERS = "edge-u"
NS = "bench"
APP = "bench-svc"
LABELS = {"topology.kubernetes.io/region": "eu", SECURITY: "2", RESIDENCY_REGION: "eu"}
STAGES = ("agent window over the SLA", "report in the core", "loop decision",
          "eviction answered", "replacement created", "replacement bound",
          "replacement Running (kwok)")


@dataclass
class Run:
    src: str
    dst: str | None = None
    t0: float = 0.0
    at: dict[str, float] = field(default_factory=dict)  # stage -> wall time
    # the loop's re-plan interval (DecisionLoop.replan_every: replan_interval_s, stretched by
    # replan_max_share x the last re-plan's cost) seen while the run waited for the decision
    replan_every: list[float] = field(default_factory=list)
    strikes: list[tuple[float, int]] = field(default_factory=list)

    def since(self, stage: str) -> float:
        return self.at[stage] - self.t0 if stage in self.at else math.nan


def _deployment(sla_ms: float) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": APP, "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": APP}},
                 "template": {
                     "metadata": {"labels": {"app": APP}, "annotations": {
                         "cfnet.io/max-latency-ms": f"{sla_ms:g}",
                         "cfnet.io/latency-to": USERS}},
                     "spec": {"schedulerName": "cfnet-scheduler",
                              "terminationGracePeriodSeconds": 1,
                              "containers": [{"name": "app", "image": "bench.invalid/app:1",
                                              "resources": {"requests": {
                                                  "cpu": "100m", "memory": "64Mi"}}}]}}}}


class Rig:
    """Control plane + kwok Nodes + lab + broker + real agents + the core's Kubernetes wiring."""

    def __init__(self, admin: KubeClient, lab: Lab, core: CoreService, runner: KubeRunner,
                 sla_ms: float) -> None:
        self.admin, self.lab, self.core, self.runner, self.sla_ms = admin, lab, core, runner, sla_ms
        self.decided: list[float] = []
        self.evicted: list[float] = []
        sink = runner.actuator.loop.actuator
        orig = sink.commit_moves

        def timed(obs: Any, moves: Any) -> Any:
            self.decided.append(time.time())
            try:
                return orig(obs, moves)
            finally:
                self.evicted.append(time.time())

        sink.commit_moves = timed  # type: ignore[method-assign]
        # each re-plan that ran: (its time, the workload's strikes after it)
        self.replans: list[tuple[float, int]] = []
        loop = runner.actuator.loop
        orig_replan = loop.replan

        def replan(obs: Any, outcome: Any, *, force: bool = False) -> int:
            before = loop.replan_state
            n = orig_replan(obs, outcome, force=force)
            if loop.replan_state is not before:
                strikes = max(loop.replan_state.strikes.values(), default=0)
                self.replans.append((time.time(), strikes if not n else -1))
            return n

        loop.replan = replan  # type: ignore[method-assign]

    def p95(self, a: str, b: str) -> tuple[float, float, float]:
        """(p95 ms of the link a -> b as a's agent measures it, that agent's ``report_ts``, the
        core's time of that sample: ``LinkView.updated``)."""
        snap = self.core.state.snapshot(time.time())
        lk = snap.links.get((a, b))
        node = snap.nodes.get(a)
        if lk is None or lk.rtt_p95_us is None or node is None:
            return math.inf, 0.0, 0.0
        return lk.rtt_p95_us / 1000.0, node.report_ts, lk.updated

    def worse_better(self, node: str) -> float:
        """The better direction's p95 (ms), as the engine judges the link."""
        return min(self.p95(node, USERS)[0], self.p95(USERS, node)[0])

    def pods(self) -> list[dict[str, Any]]:
        return list(self.admin.list(f"/api/v1/namespaces/{NS}/pods")[0])

    def live(self) -> list[dict[str, Any]]:
        return [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")]


def _kwok_node(admin: KubeClient, kwok: Any, name: str) -> None:
    kwok.node(name, labels={**LABELS, AGENT_ID: name})

    def ready() -> bool:
        st = admin.get(f"/api/v1/nodes/{name}").get("status") or {}
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in st.get("conditions") or [])

    wait_until(ready, 60, f"kwok making {name} Ready")
    # TaintNodesByCondition admission put node.kubernetes.io/not-ready on the new Node; the
    # node-lifecycle controller (off: tools.envtest.ControlPlane) would lift it now it is Ready
    admin.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})


@contextlib.contextmanager
def rig(workdir: Path, sla_ms: float, cooldown_s: float, flow_mbit: float,
        budget_s: float) -> Iterator[Rig]:
    """``flow_mbit`` 0: no flows; the agents measure the links by active probing only
    (``edge_agent.active``: an idle peer at most every 30 s), as in ``tools.demo``."""
    from tools.envtest import ControlPlane, ensure_binaries
    from tools.envtest.kwok import Kwok

    ensure_binaries()
    procs: list[subprocess.Popen[Any]] = []
    with ControlPlane(workdir / "k8s") as cp:
        admin = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        cp.ensure_namespace(NS)
        cp.ensure_namespace("cfnet-system")
        cp.wait_default_service_account(NS)
        with Kwok(cp) as kwok, Lab([SiteSpec("cloud"), *(SiteSpec(s) for s in SITES.values())],
                                   prefix="rxk") as lab:
            for node in SITES:
                _kwok_node(admin, kwok, node)
            admin.patch(f"/api/v1/nodes/{USERS}", {"spec": {"unschedulable": True}})
            broker = Broker(workdir / "broker", host=lab.addr("cloud"), netns=lab.ns("cloud"))
            broker.start()
            core: CoreService | None = None
            runner: KubeRunner | None = None
            try:
                peers = {s: lab.addr(s) for s in SITES.values()}
                for node, site in SITES.items():
                    creds = broker.add_account(node, "agent")
                    pw = workdir / f"{node}.pw"
                    pw.write_text(creds.password)
                    with open(workdir / f"{node}.log", "ab") as out:
                        procs.append(lab.popen(site, [
                            str(VENV_BIN / "cfnet-agent"), "--node", node,
                            "--broker-host", broker.host, "--broker-port", str(broker.port),
                            "--password-file", str(pw), "--ca-file", str(broker.ca_file),
                            "--buffer-path", str(workdir / f"{node}.db"), "--interval-s", "1",
                            "--peers", ",".join(a for s, a in peers.items() if s != site),
                        ], stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO)))
                for i, cand in enumerate(("edgea", "edgeb") if flow_mbit > 0 else ()):
                    procs.extend(_traffic(lab, cand, "users", budget_s, 5201 + i, flow_mbit))
                cc = broker.add_account("core-k8s", "core")
                core = CoreService(CoreConfig(
                    mqtt=MqttSettings(host=broker.host, port=broker.port, username="core-k8s",
                                      password=cc.password, tls=True, ca_file=broker.ca_file,
                                      client_id="core-k8s", keepalive_s=5),
                    db_path=workdir / "core.db", place=False, console=False))
                core.start(connect=False)
                ns, c = lab.ns("cloud"), core
                runner = start_kubernetes(admin, core.state, core.events, KubeSettings(
                    identity="bench-core", lease_duration_s=4, renew_deadline_s=3,
                    retry_period_s=1, replan=ReplanConfig(cooldown_s=cooldown_s)),
                    on_lead=lambda: in_netns(ns, c.connect), on_follow=core.disconnect)
                yield Rig(admin, lab, core, runner, sla_ms)
            finally:
                if runner is not None:
                    runner.stop()
                if core is not None:
                    core.stop()
                stop_all(procs, grace_s=10)
                broker.stop()
        admin.close()


def _traffic(lab: Lab, a: str, b: str, seconds: float, port: int,
             rate_mbit: float) -> list[subprocess.Popen[Any]]:
    """Bounded paced TCP flows a -> b and b -> a (tools.traffic: count- and time-bounded)."""
    py, out = sys.executable, []
    for src, dst in ((a, b), (b, a)):
        out.append(lab.popen(dst, [py, "-m", "tools.traffic", "sink", "--port", str(port),
                                   "--duration", str(seconds + 5)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        out.append(lab.popen(src, [py, "-m", "tools.traffic", "send", lab.addr(dst),
                                   "--port", str(port), "--rate-mbit", str(rate_mbit),
                                   "--duration", str(seconds),
                                   "--max-mb", str(rate_mbit * seconds / 8 + 1)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return out


def _settle(r: Rig, cooldown_s: float, last_move: float) -> tuple[str, str]:
    """The pod Running, both candidates' links calm, the cool-down over: (pod, node)."""
    def ok() -> tuple[str, str] | None:
        live = r.live()
        if len(live) != 1 or (live[0].get("status") or {}).get("phase") != "Running":
            return None
        node = live[0]["spec"].get("nodeName")
        if node not in ("edge-a", "edge-b") or time.time() - last_move < cooldown_s + 0.5:
            return None
        if all(r.worse_better(n) < 0.5 * r.sla_ms for n in ("edge-a", "edge-b")):
            return str(live[0]["metadata"]["name"]), str(node)
        return None
    got = wait_until(ok, 90, "the pod Running on a candidate and both links calm", 0.2)
    time.sleep(1.5)  # a few calm steps so the strikes reset (not synchronisation: settling)
    assert isinstance(got, tuple)
    return got


def one_run(r: Rig, old: str, node: str, degraded_mbit: float, delay_ms: float | None,
            timeout_s: float) -> Run:
    run = Run(node)
    r.decided.clear()
    r.evicted.clear()
    r.replans.clear()
    if delay_ms is None:
        r.lab.set_rate(SITES[node], degraded_mbit)
    else:
        r.lab.set_delay(SITES[node], delay_ms)
    run.t0 = time.time()
    first_over: dict[tuple[str, str], tuple[float, float]] = {}
    deadline = time.monotonic() + timeout_s
    next_api = 0.0
    try:
        while time.monotonic() < deadline and "replacement Running (kwok)" not in run.at:
            now = time.time()
            if "report in the core" not in run.at:
                for key in ((node, USERS), (USERS, node)):
                    ms, rts, got = r.p95(*key)
                    if key not in first_over and ms > r.sla_ms and ms != math.inf:
                        first_over[key] = (rts, got)
                if len(first_over) == 2:  # the later direction's report decides
                    rts, got = max(first_over.values(), key=lambda v: v[1])
                    run.at["agent window over the SLA"] = rts
                    run.at["report in the core"] = got
            if "loop decision" not in run.at:
                run.replan_every.append(r.runner.actuator.loop.replan_every())
            if r.decided and "loop decision" not in run.at:
                run.at["loop decision"] = r.decided[0]
            if r.evicted and "eviction answered" not in run.at:
                run.at["eviction answered"] = r.evicted[0]
            if now >= next_api:
                next_api = now + 0.05
                for p in r.live():
                    if p["metadata"]["name"] == old:
                        continue
                    run.at.setdefault("replacement created", now)
                    if p["spec"].get("nodeName"):
                        run.dst = str(p["spec"]["nodeName"])
                        run.at.setdefault("replacement bound", now)
                    if (p.get("status") or {}).get("phase") == "Running":
                        run.at.setdefault("replacement Running (kwok)", now)
            time.sleep(0.02)
        # the re-plans from the over-SLA report in the core to the decision, and the strikes
        # each left (-1: it moved the workload)
        got = run.at.get("report in the core", math.inf)
        run.strikes = [(round(t - got, 2), k) for t, k in r.replans
                       if got <= t <= run.at.get("loop decision", math.inf) + 0.01]
    finally:
        if delay_ms is None:
            r.lab.set_rate(SITES[node], None)
        else:
            r.lab.set_delay(SITES[node], 0.0)  # the lab's sites have none of their own
    return run


def bench(runs: int, sla_ms: float, degraded_mbit: float, cooldown_s: float, flow_mbit: float,
          workdir: Path, delay_ms: float | None = None) -> list[Run]:
    """``delay_ms``: degrade by that one-way delay on the site's link (as ``tools.demo``)
    instead of the rate cut."""
    out: list[Run] = []
    budget_s = runs * 40.0 + 120.0
    with rig(workdir, sla_ms, cooldown_s, flow_mbit, budget_s) as r:
        wait_until(lambda: r.runner.actuator.wait_ready(0.1), 120, "the actuator ready")
        wait_until(lambda: all(r.worse_better(n) < math.inf for n in ("edge-a", "edge-b")), 120,
                   "both candidates' links to edge-u measured by the agents")
        r.admin.create(f"/apis/apps/v1/namespaces/{NS}/deployments", _deployment(sla_ms))
        last_move = 0.0
        for i in range(runs):
            old, node = _settle(r, cooldown_s, last_move)
            run = one_run(r, old, node, degraded_mbit, delay_ms,
                          30.0 if flow_mbit > 0 else 75.0)
            out.append(run)
            log.info("run %d: %s -> %s: %s; re-plan interval max %.2f s; re-plans after the "
                     "report (s after it, strikes; -1: moved) %s", i + 1, node, run.dst,
                     ", ".join(f"{s} {run.since(s):.2f}" for s in STAGES),
                     max(run.replan_every, default=math.nan), run.strikes)
            if "loop decision" in run.at:
                last_move = run.at["loop decision"]
    return out


def table(runs: list[Run], sla_ms: float, degraded_mbit: float,
          delay_ms: float | None = None) -> str:
    what = (f"link cut to {degraded_mbit:g} Mbit/s" if delay_ms is None
            else f"one-way delay {delay_ms:g} ms added")
    lines = [f"| Kubernetes, {what} under a {sla_ms:g} ms SLA: "
             "stage | runs | from degradation p50 s | p99 s | stage alone p50 s | p99 s |",
             "|---|---:|---:|---:|---:|---:|"]
    prev = "degradation applied"
    lines.append(f"| {prev} | {len(runs)} | 0 | 0 | - | - |")
    for stage in STAGES:
        tot = [r.since(stage) for r in runs]
        alone = [r.since(stage) - (r.since(prev) if prev in r.at else 0.0) for r in runs]
        n = sum(1 for x in tot if not math.isnan(x))
        lines.append(f"| {stage} | {n} | {pct(tot, 0.5):.2f} | {pct(tot, 0.99):.2f} | "
                     f"{pct(alone, 0.5):.2f} | {pct(alone, 0.99):.2f} |")
        prev = stage
    every = [x for r in runs for x in r.replan_every]
    lines.append(f"\n(the loop's re-plan interval while a run waited for its decision: p50 "
                 f"{pct(every, 0.5):.2f} s, max {max(every, default=math.nan):.2f} s)")
    return "\n".join(lines)


def report(runs: int, sla_ms: float, degraded_mbit: float, cooldown_s: float,
           flow_mbit: float, delay_ms: float | None, as_json: bool) -> int:
    """Run the benchmark and print its table (and the runs as JSON with ``as_json``)."""
    with tempfile.TemporaryDirectory(prefix="cfnet-bench-reaction-k8s-") as tmp:
        done = bench(runs, sla_ms, degraded_mbit, cooldown_s, flow_mbit, Path(tmp), delay_ms)
    print()
    print(table(done, sla_ms, degraded_mbit, delay_ms))
    print(f"\n(cfnet-core --kubernetes wiring, kwok Nodes; agents: eBPF probe, 1 s "
          f"interval; replan every 1 s; violation_intervals 3; cooldown {cooldown_s:g} s; "
          f"2 shared CPUs)")
    if as_json:
        print(json.dumps([{"src": r.src, "dst": r.dst, **{s: r.since(s) for s in STAGES}}
                          for r in done], indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.bench_reaction_k8s [...]``, the same as ``python -m
    tools.bench_reaction --kubernetes [...]`` (``make bench`` runs it with ``--runs 5``)."""
    ap = argparse.ArgumentParser(prog="python -m tools.bench_reaction_k8s",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--sla-ms", type=float, default=20.0)
    ap.add_argument("--degraded-mbit", type=float, default=1.0)
    ap.add_argument("--flow-mbit", type=float, default=3.0,
                    help="each paced flow, each way (0 for none, active probing only)")
    ap.add_argument("--cooldown", type=float, default=3.0, help="ReplanConfig.cooldown_s")
    ap.add_argument("--delay-ms", type=float, default=None,
                    help="add this one-way delay instead of the rate cut")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        stream=sys.stderr)
    for name in ("tools.lab", "cloud_core", "edge_agent"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return report(a.runs, a.sla_ms, a.degraded_mbit, a.cooldown, a.flow_mbit, a.delay_ms,
                  a.json)


if __name__ == "__main__":
    raise SystemExit(main())
