"""`make demo`: a whole cfnet system on one machine, live.

A lab of network namespaces (a cloud site and edge sites with different link
qualities), a TLS Mosquitto with per-account ACLs and the core in the cloud
site, one agent per edge site, bounded traffic between sites, and a batch of
workloads with residency, security and latency constraints submitted through
the console. The screen shows the live link matrix, node health and where
each workload runs; the demo cleans everything up when it ends (or on Ctrl-C).

Then (``--mode both``, the default; ``--mode kubernetes`` alone) the same loop closes in
Kubernetes mode: a real control plane (etcd, kube-apiserver, kube-controller-manager; built
first, with progress shown, when the binaries are missing), a second lab whose agents measure
the links, the core as ``cfnet-core --kubernetes`` wires it (in this process: MQTT from inside
the cloud site's namespace, the Kubernetes API on loopback), and a Deployment with a latency
SLA. Mid-run one link degrades; the screen shows the pod evicted and its replacement bound to
the planned node, with the engine's words from the Kubernetes Events. There is no kubelet:
pods are bound, never run, and an evicted pod stays Terminating.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cloud_core.console.client import ConsoleClient, ConsoleUnavailable
from cloud_core.k8s.registry import AGENT_ID, RESIDENCY_REGION, SECURITY
from cloud_core.view import fmt_bps, fmt_us, nodes_table, table
from edge_agent.mqtt import MqttSettings
from tools.broker import Broker
from tools.lab import Lab, SiteSpec
from tools.netns import in_netns
from tools.procs import stop_all

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

EDGES = [
    # site, node id, rate Mbit/s, loss, one-way delay ms, region, zone, security, price/h, gCO2/kWh
    ("lyon", "edge-lyon", 100.0, 0.0, 1.0, "eu", "eu-fr", 3, 0.12, 60),
    ("milan", "edge-milan", 20.0, 0.02, 4.0, "eu", "eu-it", 2, 0.06, 250),
    ("austin", "edge-austin", 50.0, 0.0, 20.0, "us", "us-tx", 2, 0.04, 400),
    ("osaka", "edge-osaka", 10.0, 0.05, 45.0, "ap", "ap-jp", 1, 0.03, 450),
]

WORKLOADS = [
    {"name": "video-analytics", "replicas": 2, "requests": {"cpu": "500m", "memory": "256Mi"},
     "residency": "eu", "minSecurityLevel": 2},
    {"name": "payments", "requests": {"cpu": "250m", "memory": "128Mi"},
     "residency": "eu", "minSecurityLevel": 3},
    {"name": "us-cache", "replicas": 2, "requests": {"cpu": "250m"}, "residency": "us",
     "podAntiAffinity": [{"labelSelector": {"matchLabels": {"app": "us-cache"}},
                          "topologyKey": "kubernetes.io/hostname"}],
     "labels": {"app": "us-cache"}},
    {"name": "batch-report", "requests": {"cpu": "1"}, "costWeight": 5},
    {"name": "near-lyon", "requests": {"cpu": "250m"}, "maxLatencyMs": 30,
     "latencyTo": "edge-lyon"},
    {"name": "secret-ml", "requests": {"cpu": "500m"}, "minSecurityLevel": 4},
]

log = logging.getLogger("cfnet.demo")


def say(msg: str) -> None:
    print(f"\033[1m[demo]\033[0m {msg}", flush=True)


def _logfile(path: Path) -> Any:
    return open(path, "wb")  # the child process owns it


def registry_yaml() -> str:
    lines = ["nodes:"]
    for _site, node, _r, _l, _d, region, zone, sec, price, carbon in EDGES:
        lines.append(
            f"  - {{name: {node}, region: {region}, zone: {zone}, security_level: {sec}, "
            f"price_per_hour: {price}, energy_price_per_kwh: 0.2, carbon_g_per_kwh: {carbon}, "
            f"idle_watts: 10, max_watts: 60, capacity: {{cpu: '4', memory: 8Gi}}}}"
        )
    return "\n".join(lines) + "\n"


def render(c: ConsoleClient) -> str:
    nodes = c.call("nodes", timeout_s=3).data or []
    links = c.call("links", timeout_s=3).data or []
    wl = c.call("workloads", timeout_s=3).data or []
    names = [n["node"] for n in nodes]
    by = {(r["src"], r["dst"]): r for r in links}
    short = {n: n.replace("edge-", "") for n in names}
    matrix = []
    for src in names:
        row = [short[src]]
        for dst in names:
            r = by.get((src, dst))
            if src == dst:
                row.append("·")
            elif r is None or r["rtt_p50_us"] is None:
                row.append("-")
            else:
                row.append(f"{fmt_us(r['rtt_p50_us'])} {r['loss'] * 100:.0f}% "
                           f"{fmt_bps(r['tx_bps'])}")
        matrix.append(row)
    wl_rows = [(w["name"], w["state"], (w["node"] or "-").replace("edge-", ""),
                (w["reason"] or "")[:40]) for w in wl]
    return "\n\n".join([
        "LINKS (row measures column: RTT p50, loss, throughput)",
        table(matrix, ["", *[short[n] for n in names]]),
        nodes_table(nodes),
        table(wl_rows, ["WORKLOAD", "STATE", "NODE", "WHY NOT"]),
    ])


def run(duration_s: float, work: Path) -> int:
    sites = [SiteSpec("cloud")] + [
        SiteSpec(s, rate_mbit=r, loss=lo, delay_ms=d) for s, _n, r, lo, d, *_ in EDGES
    ]
    procs: list[subprocess.Popen[Any]] = []
    say(f"work directory {work}")
    with Lab(sites, prefix="demo") as lab:
        say("lab up: " + ", ".join(f"{s}={lab.addr(s)}" for s in lab.sites))
        broker = Broker(work / "broker", host=lab.addr("cloud"), netns=lab.ns("cloud"))
        broker.start()
        say(f"mosquitto up on {broker.host}:{broker.port} (TLS, passwords, ACL)")
        try:
            core = broker.add_account("core-0", "core")
            (work / "core.pw").write_text(core.password)
            (work / "registry.yaml").write_text(registry_yaml())
            (work / "roles.yaml").write_text("operators: {demo: admin}\n")
            procs.append(lab.popen("cloud", [
                str(BIN / "cfnet-core"), "--broker-host", broker.host,
                "--broker-port", str(broker.port), "--username", "core-0",
                "--password-file", str(work / "core.pw"), "--ca-file", str(broker.ca_file),
                "--db", str(work / "core.db"), "--registry", str(work / "registry.yaml"),
                "--roles", str(work / "roles.yaml"), "--table-every", "0",
            ], stdout=_logfile(work / "core.log"), stderr=subprocess.STDOUT, cwd=str(REPO)))
            say("cfnet-core started (log: core.log)")
            peers = [lab.addr(s) for s, *_ in EDGES]
            for site, node, *_ in EDGES:
                creds = broker.add_account(node, "agent")
                (work / f"{node}.pw").write_text(creds.password)
                procs.append(lab.popen(site, [
                    str(BIN / "cfnet-agent"), "--node", node, "--broker-host", broker.host,
                    "--broker-port", str(broker.port), "--password-file", str(work / f"{node}.pw"),
                    "--ca-file", str(broker.ca_file), "--buffer-path", str(work / f"{node}.db"),
                    "--peers", ",".join(p for p in peers if p != lab.addr(site)),
                ], stdout=_logfile(work / f"{node}.log"), stderr=subprocess.STDOUT,
                    cwd=str(REPO)))
            say(f"{len(EDGES)} agents started (logs: edge-*.log)")
            # Traffic: every edge sends to the next one, paced and bounded; it
            # lasts the whole demo (the wait for first reports included).
            traffic_s = duration_s + 40
            for i, (site, *_rest) in enumerate(EDGES):
                nxt = EDGES[(i + 1) % len(EDGES)][0]
                procs.append(lab.popen(nxt, [sys.executable, "-m", "tools.traffic", "sink",
                                             "--port", "5201", "--duration", str(traffic_s + 5)],
                                       cwd=str(REPO), stdout=subprocess.DEVNULL,
                                       stderr=_logfile(work / f"sink-{nxt}.log")))
                procs.append(lab.popen(site, [
                    sys.executable, "-m", "tools.traffic", "send", lab.addr(nxt), "--port", "5201",
                    "--rate-mbit", "2", "--duration", str(traffic_s), "--max-mb", "100",
                ], cwd=str(REPO), stderr=_logfile(work / f"send-{site}.log")))
            op = broker.add_account("demo", "operator")
            settings = MqttSettings(host=broker.host, port=broker.port, username="demo",
                                    password=op.password, ca_file=broker.ca_file,
                                    client_id="demo", clean_start=True, session_expiry_s=0)
            client: ConsoleClient = in_netns(
                lab.ns("cloud"), lambda: ConsoleClient(settings, "demo")
            )
            in_netns(lab.ns("cloud"), client.connect)
            with contextlib.closing(client):
                say("waiting for the first reports...")
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    with contextlib.suppress(ConsoleUnavailable):
                        ns = client.call("nodes", timeout_s=3).data or []
                        if sum(n["health"] == "online" for n in ns) == len(EDGES):
                            break
                    time.sleep(1)
                r = client.call("submit", {"specs": WORKLOADS})
                say(f"submitted {len(r.data or [])} workloads: " + (r.error or "ok"))
                end = time.monotonic() + duration_s
                while time.monotonic() < end:
                    try:
                        screen = render(client)
                    except ConsoleUnavailable as exc:
                        screen = f"(console: {exc})"
                    left = end - time.monotonic()
                    sys.stdout.write("\033[2J\033[H" if sys.stdout.isatty() else "\n")
                    print(f"cfnet demo — {len(EDGES)} edge sites, {left:.0f}s left "
                          f"(Ctrl-C to stop)\n\n{screen}", flush=True)
                    time.sleep(2)
                ex = client.call("explain", {"workload": "secret-ml"})
                if ex.ok:
                    e = ex.data.get("explanation") or {}
                    say(f"why secret-ml is not placed: {e.get('summary') or ex.data.get('reason')}")
        finally:
            stop_all(procs, grace_s=10)
            broker.stop()
    say("lab down; everything cleaned up")
    return 0


# Kubernetes part: site, node, one-way delay ms, Node cpu. edge-lyon is the latency target and
# too small for the workload; milan (RTT to lyon 10 ms) and zurich (14 ms) can both run it.
K8S_EDGES = [("lyon", "edge-lyon", 1.0, "1"), ("milan", "edge-milan", 4.0, "4"),
             ("zurich", "edge-zurich", 6.0, "4")]
K8S_SLA_MS = 25
K8S_DEGRADED_DELAY_MS = 30.0  # RTT to lyon becomes 62 ms: more than twice the SLA


def _k8s_node(admin: Any, name: str, cpu: str) -> None:
    status = {"capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
              "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                              "message": "demo node (no kubelet)"}]}
    obj = admin.create("/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "topology.kubernetes.io/region": "eu",
            SECURITY: "2", AGENT_ID: name, RESIDENCY_REGION: "eu"}},
        "status": status})
    obj["status"] = status
    admin.replace(f"/api/v1/nodes/{name}/status", obj)
    # Admission tainted the new Node not-ready; no node-lifecycle controller runs: clear it.
    admin.patch(f"/api/v1/nodes/{name}", [{"op": "replace", "path": "/spec/taints", "value": []}],
                content_type="application/json-patch+json")


def _k8s_screen(admin: Any, core: Any, t0: float, note: str) -> str:
    pods = admin.list("/api/v1/namespaces/demo/pods")[0]
    rows = [(p["metadata"]["name"], p["spec"].get("nodeName") or "-",
             "Terminating" if p["metadata"].get("deletionTimestamp") else "Bound"
             if p["spec"].get("nodeName") else "Pending") for p in pods]
    snap = core.state.snapshot(time.time())
    links = []
    names = {n for _s, n, *_ in K8S_EDGES}
    for (src, dst), lk in sorted(snap.links.items()):
        if "edge-lyon" in (src, dst) and {src, dst} <= names and lk.rtt_p50_us is not None:
            links.append((src.replace("edge-", ""), dst.replace("edge-", ""),
                          fmt_us(lk.rtt_p95_us or lk.rtt_p50_us), f"{lk.loss * 100:.0f}%"))
    evs = sorted(admin.list("/api/v1/namespaces/demo/events")[0],
                 key=lambda e: e.get("lastTimestamp") or "")
    ev_rows = [(e.get("reason", ""), (e.get("message") or "")[:150]) for e in evs
               if e.get("reason") in ("Scheduled", "Rescheduling", "EvictionBlocked",
                                      "FailedScheduling")][-8:]
    return "\n\n".join([
        f"cfnet demo (Kubernetes mode) {time.monotonic() - t0:.0f}s: {note}",
        f"Deployment near-lyon: p95 latency to edge-lyon <= {K8S_SLA_MS} ms",
        table(links, ["FROM", "TO", "RTT p95", "LOSS"]),
        table(rows, ["POD", "NODE", "STATE"]),
        "EVENTS (Kubernetes, written by cfnet)\n" + table(ev_rows, ["REASON", "MESSAGE"]),
    ])


def run_kubernetes(duration_s: float, work: Path) -> int:
    """The loop closing in Kubernetes mode (see the module docstring)."""
    from cloud_core.k8s.client import KubeClient
    from cloud_core.k8s.wiring import KubeSettings, start_kubernetes
    from cloud_core.service import CoreConfig, CoreService
    from tools.envtest import ControlPlane

    say("Kubernetes part: starting etcd, kube-apiserver, kube-controller-manager "
        "(building them first if missing)")
    procs: list[subprocess.Popen[Any]] = []
    with ControlPlane(work / "k8s", log_stream=sys.stdout) as cp:
        admin = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        cp.ensure_namespace("demo")
        cp.ensure_namespace("cfnet-system")
        cp.wait_default_service_account("demo")
        sites = [SiteSpec("cloud")] + [SiteSpec(s, delay_ms=d) for s, _n, d, _c in K8S_EDGES]
        with Lab(sites, prefix="demok") as lab:
            broker = Broker(work / "broker-k8s", host=lab.addr("cloud"), netns=lab.ns("cloud"))
            broker.start()
            core = runner = None
            try:
                peers = [lab.addr(s) for s, *_ in K8S_EDGES]
                for site, node, _d, cpu in K8S_EDGES:
                    _k8s_node(admin, node, cpu)
                    creds = broker.add_account(node, "agent")
                    (work / f"k-{node}.pw").write_text(creds.password)
                    procs.append(lab.popen(site, [
                        str(BIN / "cfnet-agent"), "--node", node, "--broker-host", broker.host,
                        "--broker-port", str(broker.port),
                        "--password-file", str(work / f"k-{node}.pw"),
                        "--ca-file", str(broker.ca_file),
                        "--buffer-path", str(work / f"k-{node}.db"),
                        "--peers", ",".join(p for p in peers if p != lab.addr(site)),
                    ], stdout=_logfile(work / f"k-{node}.log"), stderr=subprocess.STDOUT,
                        cwd=str(REPO)))
                say(f"{len(K8S_EDGES)} Nodes and agents up; the core runs in Kubernetes mode")
                cc = broker.add_account("core-k8s", "core")
                core = CoreService(CoreConfig(
                    mqtt=MqttSettings(host=broker.host, port=broker.port, username="core-k8s",
                                      password=cc.password, ca_file=broker.ca_file,
                                      client_id="core-k8s", keepalive_s=5),
                    db_path=work / "core-k8s.db", place=False, console=False))
                core.start(connect=False)
                ns = lab.ns("cloud")
                runner = start_kubernetes(admin, core.state, core.events, KubeSettings(
                    identity="demo-core", lease_duration_s=4, renew_deadline_s=3,
                    retry_period_s=1), on_lead=lambda: in_netns(ns, core.connect),
                    on_follow=core.disconnect)
                t0 = time.monotonic()
                end = t0 + duration_s
                while time.monotonic() < end:  # the agents' first link measurements
                    lk = core.state.snapshot(time.time()).links
                    if sum(1 for (a, b) in lk if "edge-lyon" in (a, b)) >= 4:
                        break
                    time.sleep(1)
                admin.create("/apis/apps/v1/namespaces/demo/deployments", {
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "near-lyon", "namespace": "demo"},
                    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "near-lyon"}},
                             "template": {
                                 "metadata": {"labels": {"app": "near-lyon"}, "annotations": {
                                     "cfnet.io/max-latency-ms": str(K8S_SLA_MS),
                                     "cfnet.io/latency-to": "edge-lyon"}},
                                 "spec": {"schedulerName": "cfnet-scheduler", "containers": [{
                                     "name": "app", "image": "registry.example/app:1",
                                     "resources": {"requests": {"cpu": "2"}}}]}}}})
                say("Deployment near-lyon created (2 CPUs: edge-lyon itself is too small)")
                first: str | None = None
                degraded_at: float | None = None
                moved_to: str | None = None
                note = "waiting for the first binding"
                while time.monotonic() < end:
                    pods = admin.list("/api/v1/namespaces/demo/pods")[0]
                    live = [p for p in pods if p["spec"].get("nodeName")
                            and not p["metadata"].get("deletionTimestamp")]
                    if first is None and live:
                        first = str(live[0]["spec"]["nodeName"])
                        bound_at = time.monotonic()
                        note = f"bound to {first}; its link to lyon degrades in 10 s"
                    if first and degraded_at is None and time.monotonic() - bound_at > 10:
                        site = next(s for s, n, *_ in K8S_EDGES if n == first)
                        lab.set_delay(site, K8S_DEGRADED_DELAY_MS)
                        degraded_at = time.monotonic()
                        note = (f"link {site} <-> lyon degraded (one-way delay "
                                f"{K8S_DEGRADED_DELAY_MS:g} ms): watch the move")
                    if degraded_at and moved_to is None and live and \
                            live[0]["spec"]["nodeName"] != first:
                        moved_to = str(live[0]["spec"]["nodeName"])
                        note = (f"moved {first} -> {moved_to}, "
                                f"{time.monotonic() - degraded_at:.1f} s after the degradation")
                        end = min(end, time.monotonic() + 8)
                    screen = _k8s_screen(admin, core, t0, note)
                    sys.stdout.write("\033[2J\033[H" if sys.stdout.isatty() else "\n")
                    print(screen, flush=True)
                    time.sleep(1)
                why = [e["message"] for e in admin.list("/api/v1/namespaces/demo/events")[0]
                       if e.get("reason") == "Rescheduling"]
                say(f"result: {note}" + (f"; cfnet said: {why[-1]}" if why else ""))
            finally:
                if runner is not None:
                    runner.stop()
                if core is not None:
                    core.stop()
                stop_all(procs, grace_s=10)
                broker.stop()
        admin.close()
    say("Kubernetes part done; control plane and lab down")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.demo", description=__doc__)
    p.add_argument("--duration", type=float, default=float(os.environ.get("DEMO_SECONDS", 60)))
    p.add_argument("--mode", choices=("local", "kubernetes", "both"),
                   default=os.environ.get("DEMO_MODE", "both"))
    p.add_argument("--k8s-duration", type=float,
                   default=float(os.environ.get("DEMO_K8S_SECONDS", 75)),
                   help="at most this long for the Kubernetes part after its setup")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        print("the demo needs root (network namespaces, eBPF)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="cfnet-demo-"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        rc = run(a.duration, work) if a.mode in ("local", "both") else 0
        if rc == 0 and a.mode in ("kubernetes", "both"):
            rc = run_kubernetes(a.k8s_duration, work)
        return rc
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"kept {work}")


if __name__ == "__main__":
    sys.exit(main())
