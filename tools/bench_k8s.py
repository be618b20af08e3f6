"""End-to-end scheduling through a real API server: upstream kube-scheduler vs cfnet vs a ceiling.

One run, one control plane (``tools.envtest.ControlPlane``: etcd + kube-apiserver), the same
Node objects for everyone (regions, zones, security levels, KubeEdge edge nodes with their
``NoSchedule`` taint) and, per scheduler and repetition, the same pods in a fresh namespace
(requests, required node affinity, tolerations, zone spread with ``DoNotSchedule``):

* **kube-scheduler** v1.34.4, built from the same ``k8s.io/kubernetes`` module as the API
  server (``tools/envtest/build.sh``), with its defaults (client QPS 50 / burst 100);
* **kube-scheduler, QPS 5000**: the same with ``clientConnection`` QPS and burst raised to
  5000 through a ``KubeSchedulerConfiguration``;
* **cfnet**: ``cfnet-core --kubernetes`` with the chart's arguments (deploy/k8s/core.yaml:
  its Mosquitto broker over TLS with the core's account, the MQTT child process, metrics,
  the SQLite store, Lease election, reflectors, batches, engine, validator, pool controller,
  ``pods/binding``, ``events.k8s.io`` events), plus ``--json-lines`` for the start-up marks;
  its CPU counts the MQTT child process too;
* **ceiling**: a minimal binder that replays a validated assignment of the same pods (taken
  from an earlier run of the same repetition) as fast as the API server takes bindings and
  one ``events.k8s.io`` event per pod, with the lean HTTP path of ``cloud_core/k8s/transport.py``
  on 32 threads (cfnet binds on 24): what a scheduler could reach on this machine if deciding
  were free.

The pods are created first (a backlog), then the scheduler process starts; the clock runs from
its start. Reported per scheduler (median and min–max over the repetitions, whose order
alternates): pods/s from process start to the last binding, time to the first binding,
CPU-seconds of the scheduler process and of kube-apiserver (``/proc``, utime + stime) over the
run, and violations found by the independent checker below (written from Kubernetes semantics
on the raw JSON, sharing no code with cfnet's engine or validator): node requests and pod
count within allocatable, nodeSelector, required node affinity, NoSchedule/NoExecute taints,
topologySpreadConstraints (``DoNotSchedule``, checked on the final state per constraint group).

With ``--kwok`` the Nodes are kwok's (``tools/envtest/kwok.py``: the kwok controller with its
"fast" stages, managing only these nodes): a bound pod then goes Running as on a kubelet's
node, and the table also gives pods/s from the scheduler's start to the last pod Running
and the time to the first one (created → Running, beside created → bound); kwok's own
status updates load the same API server, so its figures are a second table, not the first.

With ``--unschedulable PERCENT`` that share of the pods fits no node (every
``100/PERCENT``-th pod, by turns a nodeSelector no node matches and a cpu request of 64): a
run ends at the last binding of the others, and for each run the stderr line counts the pods
whose ``FailedScheduling`` event carries cfnet's answer (``. cfnet: ``; after the figures are
taken, waiting at most 10 s for them: they come in the lull after the last binding). With
``--baseline-tree`` this measures what answering them costs the bindings.

With ``--arrival RATES`` (pods/s, e.g. ``20,200``) the same Nodes then also take pods
created at a fixed rate for ``--arrival-seconds`` (at most ``--arrival-max-pods``) on a
scheduler already running: per scheduler, repetition and rate, the scheduler (the tuned
kube-scheduler and ``cfnet-core --kubernetes``, started as above, alternated) is started on
an empty namespace, binds a warm-up pod, and once its start-up's tail is over (cfnet: its
``warm`` line) the pods arrive; each is timed from its
create call's return to the watch first seeing it bound. The table (``tools.arrival``) gives
the latency p50 / p90 / p99 / max and the scheduler's and kube-apiserver's CPU per pod over
the arrival window, median (min–max) over the repetitions. ``--background N`` first binds N
pods to the Nodes directly (no scheduler), a steady population both schedulers see. With
``--baseline-tree`` cfnet from that tree takes its turn beside cfnet in every repetition
(before / after on the same control plane).

    python -m tools.bench_k8s [--nodes 100 --pods 500 --reps 3] [--quick] [--kwok]
    python -m tools.bench_k8s --nodes 1000 --arrival 20,200 [--arrival-seconds 30]
        [--background 2000] [--only kube-qps,cfnet]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_core.errors import KubeError, KubeGone
from cloud_core.k8s.client import KubeClient
from tools import arrival
from tools.broker import Broker, free_port
from tools.envtest import ControlPlane, all_binary_paths
from tools.envtest.kwok import ANNOTATION as KWOK_ANNOTATION
from tools.envtest.kwok import Kwok
from tools.procs import stop_group

REPO = Path(__file__).resolve().parent.parent
REGION = "topology.kubernetes.io/region"
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
SECURITY = "node-restriction.kubernetes.io/cfnet-security-level"  # registry.SECURITY
EDGE = "node-role.kubernetes.io/edge"
LEGACY_SECURITY = "cfnet.io/security-level"  # registry.LEGACY: ignored, warned about
TICK = os.sysconf("SC_CLK_TCK")
IDLE_S = 3.0  # an arrival run's look at the idle CPU rates, before the arrivals
WARM_WAIT_S = 12.0  # the longest an arrival run waits for cfnet's "warm" line
N_REGIONS, ZONES_PER_REGION = 4, 3


def cpu_seconds(pid: int, children: bool = False) -> float:
    """utime + stime of a live process (all its threads), from /proc; with ``children``,
    plus its live child processes' (cfnet-core's MQTT process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    total = (int(rest[11]) + int(rest[12])) / TICK
    if children:
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == pid:
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    c = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(c[1]) == pid:
                total += (int(c[11]) + int(c[12])) / TICK
    return total


# -- the cluster -------------------------------------------------------------------------------
def node_object(j: int, kwok: bool = False, field: bool = False) -> dict[str, Any]:
    """Node ``j``: every 5th a tainted KubeEdge edge node. ``field`` (``--field-mix``): every
    2nd is, and each also carries the older node-writable ``cfnet.io/security-level``
    label cfnet ignores and warns about (a cluster moved from an earlier cfnet). The field
    mix's edge nodes alternate within each zone (``j // N_REGIONS``), not by region: with
    ``j % 2`` two whole regions would be edge-only, and a spread pod that does not tolerate
    the taint would see their empty zones as domains (nodeTaintsPolicy Ignore) and stay
    Pending, with either scheduler."""
    region = f"r{j % N_REGIONS}"
    zone = f"{region}-{(j // N_REGIONS) % ZONES_PER_REGION}"
    name = f"bn-{j:05d}"
    labels = {HOSTNAME: name, REGION: region, ZONE: zone,
              SECURITY: str(1 + (j // (N_REGIONS * ZONES_PER_REGION)) % 3)}
    taints = []
    if field:
        labels[LEGACY_SECURITY] = labels[SECURITY]
    if (j // N_REGIONS % 2 if field else j % 5) == 0:  # a KubeEdge edge node, as KubeEdge marks it
        labels[EDGE] = ""
        labels["apps.kubeedge.io/belonging-to"] = f"edge-{region}"
        taints.append({"key": EDGE, "effect": "NoSchedule"})
    md: dict[str, Any] = {"name": name, "labels": labels}
    if kwok:  # kwok's to run: its pods go Running, its status and Lease are kept alive
        md["annotations"] = {KWOK_ANNOTATION: "fake"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": md,
            "spec": {"taints": taints} if taints else {}}


NODE_STATUS = {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
               "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
               "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                               "message": "bench node"}]}


def make_node(c: KubeClient, j: int, kwok: bool = False, field: bool = False) -> None:
    obj = node_object(j, kwok, field)
    name = obj["metadata"]["name"]
    if kwok:  # its status from the start: kwok keeps it (a later PUT would race kwok's own)
        live = c.create("/api/v1/nodes", {**obj, "status": NODE_STATUS})
    else:
        live = c.create("/api/v1/nodes", obj)
        live["status"] = NODE_STATUS
        live = c.replace(f"/api/v1/nodes/{name}/status", live)
    want = obj["spec"].get("taints")
    if (live.get("spec") or {}).get("taints") != want:
        # TaintNodesByCondition added node.kubernetes.io/not-ready; no node-lifecycle
        # controller runs here to lift it once the node is Ready, so play its part.
        c.patch(f"/api/v1/nodes/{name}", [{"op": "replace", "path": "/spec/taints",
                                           "value": want or []}],
                content_type="application/json-patch+json")


NOWHERE = "bench.cfnet.io/nowhere"  # a node label no node carries


def unschedulable(i: int, percent: float) -> str:
    """Why pod ``i`` fits no node when it is one of the ``percent`` % that do not (every
    ``100/percent``-th, by turns ``selector`` and ``cpu``); "" for the others."""
    every = max(1, round(100 / percent)) if percent > 0 else 0
    if not every or i % every:
        return ""
    return ("selector", "cpu")[i // every % 2]


def pod_object(i: int, ns: str, scheduler: str, nowhere: str = "",
               field: bool = False) -> dict[str, Any]:
    """Pod ``i`` of the mix: 40 % plain, 20 % region affinity, 10 % security affinity, 15 %
    tolerating the edge taint, 15 % spread over zones (maxSkew 1, DoNotSchedule). ``nowhere``:
    the pod fits no node, by turns through a nodeSelector no node matches and a cpu request
    no node has (``--unschedulable``). ``field`` (``--field-mix``): every 3rd pod also
    requires its region (r0, r1 or r2, by turns) and tolerates the edge taint; spread pods
    are left as they are, so each spread group's pods share one set of domains (the checker's
    end-state skew is exact only then: kube-scheduler checks a pod's skew over the domains
    its own node affinity allows, at the time it is placed)."""
    kind = i % 20
    cpu = "64" if nowhere == "cpu" else f"{100 + 100 * (i % 5)}m"
    mem = f"{128 * (1 + i % 4)}Mi"
    labels = {"app": f"web-{i % 10}"}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "app", "image": "registry.example/app:1",
                        "resources": {"requests": {"cpu": cpu, "memory": mem}}}],
    }
    if nowhere == "selector":
        spec["nodeSelector"] = {NOWHERE: "yes"}
    if 8 <= kind <= 11:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": REGION, "operator": "In", "values": ["r0", "r1"]}]}]}}}
    elif kind in (12, 13):
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": SECURITY, "operator": "In", "values": ["2", "3"]}]}]}}}
    elif kind in (14, 15, 16):
        spec["tolerations"] = [{"key": EDGE, "operator": "Exists", "effect": "NoSchedule"}]
    elif kind >= 17:
        group = f"g{(i // 20) % 5}"
        labels = {"spread": group}
        spec["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"spread": group}}}]
    if field and i % 3 == 0 and not 8 <= kind <= 11 and kind < 17:  # 8-11 require a region
        terms = [{"matchExpressions": [{"key": REGION, "operator": "In",
                                        "values": [f"r{(i // 3) % 3}"]}]}]
        aff = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        req = aff.get("requiredDuringSchedulingIgnoredDuringExecution")
        if req:  # ANDed into each of its terms
            for t in req["nodeSelectorTerms"]:
                t["matchExpressions"] += terms[0]["matchExpressions"]
        else:
            aff["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
        spec.setdefault("tolerations", []).append(
            {"key": EDGE, "operator": "Exists", "effect": "NoSchedule"})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p-{i:05d}", "namespace": ns, "labels": labels},
            "spec": spec}


# -- the independent checker -------------------------------------------------------------------
def _qty(v: str) -> float:
    """cpu in cores / memory in bytes, for the suffixes this bench writes (m, Mi, Gi, none)."""
    for suf, mul in (("m", 1e-3), ("Ki", 2.0**10), ("Mi", 2.0**20), ("Gi", 2.0**30)):
        if v.endswith(suf):
            return float(v[: -len(suf)]) * mul
    return float(v)


def _expr_ok(e: dict[str, Any], labels: dict[str, str]) -> bool:
    v, op, vals = labels.get(e["key"]), e["operator"], e.get("values") or []
    if op == "In":
        return v is not None and v in vals
    if op == "NotIn":
        return v is None or v not in vals
    if op == "Exists":
        return v is not None
    if op == "DoesNotExist":
        return v is None
    if op in ("Gt", "Lt") and v is not None:
        return int(v) > int(vals[0]) if op == "Gt" else int(v) < int(vals[0])
    return False


def _affinity_ok(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not req:
        return True
    return any(t.get("matchExpressions") and all(_expr_ok(e, labels)
                                                 for e in t["matchExpressions"])
               for t in req.get("nodeSelectorTerms") or [])


def _tolerated(spec: dict[str, Any], taint: dict[str, Any]) -> bool:
    for t in spec.get("tolerations") or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == \
                (taint.get("value") or ""):
            return True
    return False


def check(pods: Sequence[dict[str, Any]], nodes: Sequence[dict[str, Any]]) -> list[str]:
    """Every broken hard constraint of the bound ``pods`` (empty: all sound)."""
    out: list[str] = []
    by_name = {n["metadata"]["name"]: n for n in nodes}
    used: dict[str, list[float]] = {}
    for p in pods:
        node_name = p["spec"].get("nodeName")
        if not node_name:
            continue
        pname = p["metadata"]["name"]
        node = by_name.get(node_name)
        if node is None:
            out.append(f"{pname}: unknown node {node_name}")
            continue
        labels = node["metadata"].get("labels") or {}
        if not _affinity_ok(p["spec"], labels):
            out.append(f"{pname}: node affinity/selector broken on {node_name}")
        for t in (node.get("spec") or {}).get("taints") or []:
            if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(p["spec"], t):
                out.append(f"{pname}: untolerated taint {t['key']} on {node_name}")
        u = used.setdefault(node_name, [0.0, 0.0, 0.0])
        for c in p["spec"]["containers"]:
            req = (c.get("resources") or {}).get("requests") or {}
            u[0] += _qty(req.get("cpu", "0"))
            u[1] += _qty(req.get("memory", "0"))
        u[2] += 1
    for name, u in used.items():
        alloc = (by_name[name].get("status") or {}).get("allocatable") or {}
        for k, i in (("cpu", 0), ("memory", 1), ("pods", 2)):
            if u[i] > _qty(alloc.get(k, "0")) + 1e-9:
                out.append(f"{name}: {k} {u[i]:g} over allocatable {alloc.get(k)}")
    out.extend(_spread_violations(pods, by_name))
    return out


def _spread_violations(pods: Sequence[dict[str, Any]],
                       nodes: dict[str, dict[str, Any]]) -> list[str]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in pods:
        for c in p["spec"].get("topologySpreadConstraints") or []:
            if c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule":
                # one group per set of domains: with nodeAffinityPolicy Honor a pod's
                # skew is counted over the nodes its own affinity allows
                aff = {k: p["spec"].get(k) for k in ("nodeSelector", "affinity")}
                key = (p["metadata"]["namespace"], json.dumps([c, aff], sort_keys=True))
                groups.setdefault(key, []).append(p)
    out = []
    for (ns, cj), members in groups.items():
        c = json.loads(cj)[0]
        sel = (c.get("labelSelector") or {}).get("matchLabels") or {}
        tk = c["topologyKey"]
        spec0 = members[0]["spec"]
        # eligible domains: nodes with the key that pass the pods' node affinity (Honor);
        # taints are ignored (nodeTaintsPolicy Ignore, the default)
        counts = {(n["metadata"].get("labels") or {}).get(tk): 0 for n in nodes.values()
                  if tk in (n["metadata"].get("labels") or {})
                  and _affinity_ok(spec0, n["metadata"].get("labels") or {})}
        for p in pods:
            node = nodes.get(p["spec"].get("nodeName") or "")
            if node is None or p["metadata"]["namespace"] != ns:
                continue
            d = (node["metadata"].get("labels") or {}).get(tk)
            plabels = p["metadata"].get("labels") or {}
            if d in counts and all(plabels.get(k) == v for k, v in sel.items()):
                counts[d] += 1
        if not counts:
            continue
        low = min(counts.values())
        for p in members:
            node = nodes.get(p["spec"].get("nodeName") or "")
            if node is None:
                continue
            d = (node["metadata"].get("labels") or {}).get(tk)
            if d not in counts or counts[d] - low > int(c["maxSkew"]):
                out.append(f"{p['metadata']['name']}: {tk} skew {counts.get(d)} - {low} > "
                           f"{c['maxSkew']}")
    return out


# -- one run -----------------------------------------------------------------------------------
@dataclass
class Run:
    scheduler: str
    rep: int
    pods: int
    bound: int = 0
    wall_s: float = float("nan")
    first_s: float = float("nan")
    last_s: float = float("nan")
    sched_cpu_s: float = float("nan")
    first_cpu_s: float = float("nan")  # the scheduler's CPU when its first binding is seen
    api_cpu_s: float = float("nan")
    # with --kwok: pods seen Running (kwok's fast stages), and when, from the same clock
    running: int = 0
    first_running_s: float = float("nan")
    last_running_s: float = float("nan")
    violations: list[str] = field(default_factory=list)
    assignment: dict[str, str] = field(default_factory=dict)
    answered: int = 0  # --unschedulable: pods whose FailedScheduling event has cfnet's answer

    @property
    def rate(self) -> float:
        return self.bound / self.wall_s if self.wall_s > 0 and self.bound else 0.0

    @property
    def running_rate(self) -> float:
        """pods/s from the scheduler's start to the last pod seen Running (--kwok)."""
        return self.running / self.last_running_s if self.running and \
            self.last_running_s > 0 else float("nan")

    @property
    def steady(self) -> float:
        """pods/s from the first binding to the last (start-up left out)."""
        span = self.last_s - self.first_s
        return (self.bound - 1) / span if span > 0 and self.bound > 1 else float("nan")


class Bench:
    def __init__(self, cp: ControlPlane, args: argparse.Namespace) -> None:
        self.cp = cp
        self.args = args
        self.admin = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        self.dir = Path(tempfile.mkdtemp(prefix="cfnet-bench-k8s-"))
        self.kube_scheduler = str(all_binary_paths()["kube-scheduler"])
        assert cp.api_proc is not None
        self.api_pid = cp.api_proc.pid
        self.nodes: list[dict[str, Any]] = []
        # the pods a run waits for: all but the --unschedulable ones
        self.expected = sum(not unschedulable(i, args.unschedulable) for i in range(args.pods))
        self.bg: list[dict[str, Any]] = []  # --background: pods bound without a scheduler
        # cfnet-core's broker, as the chart deploys one beside it (TLS, passwords, ACL)
        self.broker = Broker(self.dir / "broker")
        self.broker.start()
        self.core_creds = self.broker.add_account("core-k8s", "core")
        (self.dir / "core.pw").write_text(self.core_creds.password)

    def py_env(self, tree: str) -> dict[str, str]:
        """A deployed scheduler starts from compiled bytecode: keep it (outside the source
        trees), whatever PYTHONDONTWRITEBYTECODE says here."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        return {**env, "PYTHONPATH": tree, "PYTHONPYCACHEPREFIX": str(self.dir / "pycache")}

    def setup(self) -> None:
        for tree in {str(REPO), self.args.baseline_tree} - {""}:  # compile once, not timed
            # cp_model too: the core imports it in the background once synced, and a fresh
            # cache prefix would compile pandas from source there (a deployed image has it)
            mods = ("cloud_core.main, cloud_core.k8s.wiring, cloud_core.placement.solver, "
                    "ortools.sat.python.cp_model") + (
                ", tools.bench_k8s" if tree == str(REPO) else "")
            subprocess.run([sys.executable, "-c", f"import {mods}"], check=True,
                           env=self.py_env(tree), cwd=tree)
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda j: make_node(self.admin, j, self.args.kwok,
                                                 self.args.field_mix),
                        range(self.args.nodes)))
        self.nodes = self.admin.list("/api/v1/nodes")[0]
        for ns in ("cfnet-bench",):
            self.cp.ensure_namespace(ns)
        print(f"# {len(self.nodes)} nodes in {time.monotonic() - t0:.1f} s", file=sys.stderr,
              flush=True)

    def api_requests(self) -> dict[str, float]:
        """The API server's ``apiserver_request_total``, summed per verb, resource and
        subresource (its /metrics): what a scheduler asked for during a run."""
        try:
            text = self.admin.lean.request("GET", "/metrics", decoder=lambda b: b.decode())
        except KubeError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels, _, value = line.rpartition(" ")
            kv = dict(part.split("=", 1) for part in
                      labels[len("apiserver_request_total{"):-1].split('",'))
            key = " ".join(v.strip('"') for v in (kv.get("verb", ""), kv.get("resource", ""),
                                                 kv.get("subresource", "")) if v.strip('"'))
            out[key] = out.get(key, 0.0) + float(value)
        return out

    def _create_pods(self, ns: str, scheduler: str) -> None:
        self.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns}})
        path = f"/api/v1/namespaces/{ns}/pods"
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda i: self.admin.create(path, pod_object(
                i, ns, scheduler, unschedulable(i, self.args.unschedulable),
                self.args.field_mix)),
                range(self.args.pods)))

    def _start(self, name: str, tag: str) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{tag}.log", "wb")  # noqa: SIM115 - owned by the process
        kc = str(self.cp.kubeconfig)
        if name.startswith("kube-scheduler"):
            cfg = self.dir / f"{tag}.yaml"
            conn = f"  kubeconfig: {kc}\n"
            if "5000" in name:
                conn += "  qps: 5000\n  burst: 5000\n"
            cfg.write_text("apiVersion: kubescheduler.config.k8s.io/v1\n"
                           "kind: KubeSchedulerConfiguration\n"
                           f"clientConnection:\n{conn}"
                           "leaderElection:\n  leaderElect: false\n")
            argv = [self.kube_scheduler, f"--config={cfg}", "--secure-port=0", "--v=1"]
        elif name.startswith("cfnet"):
            prof = ["-m", "tools.bench_k8s", "--sample-to", str(self.dir / f"{tag}.prof.txt"),
                    "--"] if self.args.profile else ["-m", "cloud_core.main"]
            # deploy/k8s/core.yaml's arguments, with this run's broker, files and lease
            argv = [sys.executable, *prof, "--kubernetes", "--json-lines", "--kubeconfig", kc,
                    "--lease-duration=15", "--edge-taint=respect",
                    "--broker-host=127.0.0.1", f"--broker-port={self.broker.port}",
                    f"--username={self.core_creds.username}",
                    f"--password-file={self.dir / 'core.pw'}",
                    f"--ca-file={self.core_creds.ca_file}", f"--db={self.dir / tag}.db",
                    f"--metrics-port={free_port()}", "--table-every=0",
                    "--identity", f"bench-{tag}", "--lease-namespace", "cfnet-bench",
                    "--lease-name", f"lease-{tag}", *self.args.cfnet_arg]
        else:
            raise ValueError(name)
        tree = self.args.baseline_tree if name == BASELINE else str(REPO)
        env = self.py_env(tree)
        # cwd is the tree: ``python -m`` puts the working directory first on sys.path
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=tree,
                                start_new_session=True)
        log.close()
        return proc

    def run(self, name: str, rep: int, replay: dict[str, str] | None = None) -> Run:
        tag = f"{SHORT[name]}-{rep}"
        ns = f"bench-{tag}-{os.getpid() % 10000}"
        sched = "default-scheduler" if name.startswith("kube-scheduler") else "cfnet-scheduler"
        if name == "ceiling":
            sched = "nobody"  # no scheduler picks these up; the binder binds them
        self._create_pods(ns, sched)
        r = Run(name, rep, self.args.pods)
        items, rv = self.admin.list(f"/api/v1/namespaces/{ns}/pods")
        bound: dict[str, str] = {}
        running: dict[str, float] = {}  # pod -> when first seen Running (--kwok)
        all_running = threading.Event()
        first: list[float] = []
        pid: list[int] = []  # the scheduler's, once started
        last_bind = [float("nan")]
        done = threading.Event()
        stop = threading.Event()

        at = [rv]  # where the watch resumes: each event's resourceVersion

        def relist() -> None:
            """After a 410 (the watch fell behind the API server's window): the pods
            bound meanwhile, from a fresh list (their binding times are the list's)."""
            items, at[0] = self.admin.list(f"/api/v1/namespaces/{ns}/pods")
            now = time.monotonic()
            for p in items:
                node = (p.get("spec") or {}).get("nodeName")
                if node and p["metadata"]["name"] not in bound:
                    last_bind[0] = now
                    bound[p["metadata"]["name"]] = node
            if len(bound) >= self.expected:
                done.set()

        def watch() -> None:
            while not stop.is_set() and not done.is_set():
                try:
                    for kind, obj in self.admin.watch(f"/api/v1/namespaces/{ns}/pods", at[0],
                                                      timeout_s=60, stop=stop):
                        at[0] = (obj.get("metadata") or {}).get("resourceVersion", at[0])
                        node = (obj.get("spec") or {}).get("nodeName")
                        if kind != "BOOKMARK" and node and self.args.kwok and \
                                (obj.get("status") or {}).get("phase") == "Running":
                            running.setdefault(obj["metadata"]["name"], time.monotonic())
                            if len(running) >= self.expected:
                                all_running.set()
                        if kind != "BOOKMARK" and node:
                            now = time.monotonic()
                            if not first:
                                first.append(now)
                                if pid and self.args.profile and name.startswith("cfnet"):
                                    with contextlib.suppress(OSError):
                                        os.kill(pid[0], signal.SIGUSR1)  # its start-up profile
                                if pid:  # start-up CPU: load-independent, unlike the clock
                                    r.first_cpu_s = cpu_seconds(
                                        pid[0], children=name.startswith("cfnet"))
                            if obj["metadata"]["name"] not in bound:  # not kwok's updates
                                last_bind[0] = now
                            bound[obj["metadata"]["name"]] = node
                            if len(bound) >= self.expected:
                                done.set()
                                if not self.args.kwok or all_running.is_set():
                                    return
                except KubeGone as e:
                    print(f"# watch: {e}; listing again", file=sys.stderr)
                    with contextlib.suppress(KubeError):
                        relist()
                except KubeError as e:
                    print(f"# watch: {e}", file=sys.stderr)
                    time.sleep(0.2)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        req0 = self.api_requests()
        api0 = cpu_seconds(self.api_pid)
        t0 = time.monotonic()
        wall0 = time.time()
        if name == "ceiling":
            assert replay is not None
            proc = self._start_binder(ns, items, replay, tag)  # imports done, waits for "go"
            api0 = cpu_seconds(self.api_pid)
            t0 = time.monotonic()
            assert proc.stdin is not None
            pid.append(proc.pid)
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        else:
            proc = self._start(name, tag)
            pid.append(proc.pid)
        try:
            last = (0, time.monotonic())
            while not done.wait(0.2):
                if len(bound) != last[0]:
                    last = (len(bound), time.monotonic())
                crashed = proc.poll() is not None and name != "ceiling"
                if crashed or time.monotonic() - last[1] > self.args.stall_s \
                        or time.monotonic() - t0 > self.args.timeout_s:
                    break
            t_end = time.monotonic()
            r.sched_cpu_s = cpu_seconds(proc.pid, children=name.startswith("cfnet"))
            r.api_cpu_s = cpu_seconds(self.api_pid) - api0
            req1 = self.api_requests()
            if self.args.unschedulable and name.startswith("cfnet") and done.is_set():
                # measured already; the answers come in the lull after the last binding
                r.answered = self._answers(ns, ANSWERS_WAIT_S)
            if self.args.profile and name.startswith("cfnet"):
                self._child_threads(proc.pid, tag)
            if self.args.kwok and done.is_set():  # then kwok's part: bound -> Running
                n = (-1, time.monotonic())
                while not all_running.wait(0.2):
                    if len(running) != n[0]:
                        n = (len(running), time.monotonic())
                    if time.monotonic() - n[1] > self.args.stall_s:
                        break
        finally:
            # also when the bench itself is interrupted: the scheduler runs in a session of
            # its own and would outlive us
            stop_group(proc)
        stop.set()
        r.bound = len(bound)
        # complete: up to the last binding; incomplete: up to when the run was given up
        r.wall_s = (last_bind[0] if done.is_set() else t_end) - t0
        r.first_s = first[0] - t0 if first else float("nan")
        r.last_s = last_bind[0] - t0
        if running:
            r.running = len(running)
            r.first_running_s = min(running.values()) - t0
            r.last_running_s = max(running.values()) - t0
        pods = self.admin.list(f"/api/v1/namespaces/{ns}/pods")[0]
        r.violations = check(pods, self.nodes)
        r.assignment = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods
                        if p["spec"].get("nodeName")}
        try:  # thousands of pods: the collection delete takes a while
            self.admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                               body={"apiVersion": "v1", "kind": "DeleteOptions",
                                     "gracePeriodSeconds": 0}, timeout=300)
        except KubeError as e:
            print(f"# deleting the pods of {ns}: {e}", file=sys.stderr)
        marks = ""
        if name.startswith("cfnet"):  # its lifecycle lines: where the start-up goes
            for line in (self.dir / f"{tag}.log").read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    with contextlib.suppress(ValueError, KeyError):
                        ev = json.loads(line)
                        marks += f" {ev['event']}@{ev['t'] - wall0:.2f}"
        per = {k: (v - req0.get(k, 0.0)) / max(r.bound, 1) for k, v in req1.items()}
        print(f"# {name} rep {rep}: API requests per pod: " + ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])
            if v >= 0.001), file=sys.stderr)
        print(f"# {name} rep {rep}:{marks} {r.bound}/{r.pods} bound in {r.wall_s:.2f} s "
              f"({r.rate:.0f} pods/s), first {r.first_s:.2f} s (cpu {r.first_cpu_s:.2f} s), "
              f"cpu {r.sched_cpu_s:.1f} s, "
              f"apiserver {r.api_cpu_s:.1f} s, "
              + (f"{r.running} Running by {r.last_running_s:.2f} s (first "
                 f"{r.first_running_s:.2f} s), " if self.args.kwok else "")
              + (f"{r.answered} cfnet answers in FailedScheduling events, "
                 if self.args.unschedulable else "")
              + f"{len(r.violations)} violations "
              f"{r.violations[:3]}", file=sys.stderr, flush=True)
        return r

    def _answers(self, ns: str, wait_s: float) -> int:
        """Pods of ``ns`` whose FailedScheduling event carries cfnet's answer, once all the
        unschedulable ones have one or after ``wait_s``."""
        want = self.args.pods - self.expected
        until = time.monotonic() + wait_s
        while True:
            evs = self.admin.list(f"/api/v1/namespaces/{ns}/events")[0]
            n = len({e["involvedObject"]["name"] for e in evs
                     if e.get("reason") == "FailedScheduling"
                     and ". cfnet: " in (e.get("message") or "")})
            if n >= want or time.monotonic() >= until:
                return n
            time.sleep(1.0)

    # -- arrival mode ------------------------------------------------------------------------
    def background(self, n: int) -> None:
        """``n`` pods bound at creation (``spec.nodeName``, round robin over the Nodes; no
        scheduler): a steady population both schedulers see as running pods."""
        ns, names = "bench-bg", [nd["metadata"]["name"] for nd in self.nodes]
        self.cp.ensure_namespace(ns)

        def one(i: int) -> None:
            self.admin.create(f"/api/v1/namespaces/{ns}/pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"bg-{i:05d}", "namespace": ns, "labels": {"app": "bg"}},
                "spec": {"nodeName": names[i % len(names)],
                         "tolerations": [{"key": EDGE, "operator": "Exists"}],
                         "containers": [{"name": "app", "image": "registry.example/app:1",
                                         "resources": {"requests": {"cpu": "100m",
                                                                    "memory": "64Mi"}}}]}})

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(one, range(n)))
        self.bg = self.admin.list(f"/api/v1/namespaces/{ns}/pods")[0]

    def arrival_run(self, name: str, rep: int, rate: float) -> arrival.ArrivalRun:
        """``name`` started on an empty namespace; once it has bound a warm-up pod, pods
        arrive at ``rate`` per second; each timed from its create call's return to the
        watch first seeing it bound."""
        tag = f"{SHORT[name]}-a{rate:g}-{rep}".replace(".", "-")
        ns = f"arr-{tag}-{os.getpid() % 10000}"
        path = f"/api/v1/namespaces/{ns}/pods"
        sched = "default-scheduler" if name.startswith("kube-scheduler") else "cfnet-scheduler"
        self.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns}})
        due = arrival.slots(rate, self.args.arrival_seconds, self.args.arrival_max_pods)
        nan = float("nan")
        r = arrival.ArrivalRun(name, rep, rate, [nan] * len(due), [nan] * len(due))
        seen: dict[str, float] = {}  # pod -> when the watch first saw it bound
        stop = threading.Event()
        rv = [self.admin.list(path)[1]]

        def watch() -> None:
            while not stop.is_set():
                try:
                    for kind, obj in self.admin.watch(path, rv[0], timeout_s=60, stop=stop):
                        md = obj.get("metadata") or {}
                        rv[0] = md.get("resourceVersion", rv[0])
                        if kind != "BOOKMARK" and (obj.get("spec") or {}).get("nodeName"):
                            seen.setdefault(md["name"], time.monotonic())
                except KubeGone as e:  # fell behind: resume from a fresh list
                    print(f"# watch: {e}; listing again", file=sys.stderr)
                    with contextlib.suppress(KubeError):
                        items, rv[0] = self.admin.list(path)
                        now = time.monotonic()
                        for p in items:
                            if (p.get("spec") or {}).get("nodeName"):
                                seen.setdefault(p["metadata"]["name"], now)
                except KubeError as e:
                    print(f"# watch: {e}", file=sys.stderr)
                    time.sleep(0.2)

        threading.Thread(target=watch, daemon=True).start()
        proc = self._start(name, tag)
        children = name.startswith("cfnet")
        try:
            warm = pod_object(0, ns, sched, field=self.args.field_mix)
            warm["metadata"]["name"] = "warm-up"
            self.admin.create(path, warm)
            deadline = time.monotonic() + 4 * self.args.stall_s
            while "warm-up" not in seen and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            if "warm-up" not in seen:
                raise RuntimeError(f"{name} bound no warm-up pod (see {self.dir / tag}.log)")
            # its start-up's tail not counted: cfnet's CP-SAT import in the background (0.7
            # CPU-s, from 2 s after its sync: its "warm" line; a tree without the line, at
            # most WARM_WAIT_S), kube-scheduler's 2 s
            self._settle(name, tag)
            idle, sched_idle = self._idle_rates(proc.pid, children)
            c0, a0 = cpu_seconds(proc.pid, children=children), cpu_seconds(self.api_pid)
            w0 = time.monotonic()
            self._arrive(path, sched, due, r)
            want = {f"p-{i:05d}" for i, c in enumerate(r.created) if c == c}
            last = (-1, time.monotonic())
            while not want <= seen.keys() and proc.poll() is None:
                got = len(want & seen.keys())
                if got != last[0]:
                    last = (got, time.monotonic())
                if time.monotonic() - last[1] > self.args.stall_s:
                    break
                time.sleep(0.05)
            r.sched_cpu_s = cpu_seconds(proc.pid, children=children) - c0
            r.api_cpu_s = cpu_seconds(self.api_pid) - a0
            r.api_idle_cpu_s = idle * (time.monotonic() - w0)
            r.sched_idle_cpu_s = sched_idle * (time.monotonic() - w0)
        finally:
            stop_group(proc)
            stop.set()
        r.bound = [seen.get(f"p-{i:05d}", nan) for i in range(len(due))]
        pods = self.admin.list(path)[0]
        r.violations = check([*pods, *self.bg], self.nodes)
        try:
            self.admin.request("DELETE", path, body={"apiVersion": "v1", "kind": "DeleteOptions",
                                                     "gracePeriodSeconds": 0}, timeout=300)
        except KubeError as e:
            print(f"# deleting the pods of {ns}: {e}", file=sys.stderr)
        print(f"# arrival {name} {rate:g}/s rep {rep}: {r.n_bound}/{r.pods} bound, p50 "
              f"{r.percentile_ms(0.5):.0f} ms, p99 {r.percentile_ms(0.99):.0f} ms, max "
              f"{r.max_ms():.0f} ms, cpu {r.sched_cpu_s:.2f} s (at its idle rate "
              f"{r.sched_idle_cpu_s:.2f} s), apiserver {r.api_cpu_s:.2f} s (at its idle rate "
              f"{r.api_idle_cpu_s:.2f} s), "
              f"{len(r.violations)} violations {r.violations[:3]}", file=sys.stderr, flush=True)
        return r

    def _idle_rates(self, pid: int, children: bool) -> tuple[float, float]:
        """The API server's and the scheduler's CPU seconds per second over ``IDLE_S``
        with no pod arriving (what an arrival window's figures hold besides the pods)."""
        a0, s0, t0 = cpu_seconds(self.api_pid), cpu_seconds(pid, children), time.monotonic()
        time.sleep(IDLE_S)
        dt = time.monotonic() - t0
        return ((cpu_seconds(self.api_pid) - a0) / dt,
                (cpu_seconds(pid, children) - s0) / dt)

    def _settle(self, name: str, tag: str) -> None:
        """Wait out ``name``'s start-up tail before the arrivals (see ``arrival_run``)."""
        if not name.startswith("cfnet"):
            time.sleep(2.0)
            return
        until = time.monotonic() + WARM_WAIT_S
        log = self.dir / f"{tag}.log"
        while time.monotonic() < until and '"event": "warm"' not in log.read_text(
                errors="replace"):
            time.sleep(0.1)
        time.sleep(0.5)

    def _arrive(self, path: str, sched: str, due: Sequence[float],
                r: arrival.ArrivalRun) -> None:
        """Create pod i at ``due[i]`` s from now (open loop: a late slot is created at once),
        recording when each create call returned."""
        ns = path.split("/")[4]
        nxt = iter(range(len(due)))
        lock = threading.Lock()
        t0 = time.monotonic() + 0.05

        def creator() -> None:
            while True:
                with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                wait = t0 + due[i] - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                try:
                    self.admin.create(path, pod_object(i, ns, sched,
                                                       field=self.args.field_mix))
                except KubeError as e:
                    print(f"# create p-{i:05d}: {e}", file=sys.stderr)
                    continue
                r.created[i] = time.monotonic()

        threads = [threading.Thread(target=creator, daemon=True)
                   for _ in range(min(ARRIVAL_THREADS, max(len(due), 1)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _child_threads(self, pid: int, tag: str) -> None:
        """The MQTT child process's CPU per thread (the profile's other half), appended to
        the run's profile table once it exists; thread ids in start order (the first is the
        command loop, then paho's network thread, the forwarder, the ack waiter)."""
        lines = []
        for d in os.listdir("/proc"):
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid != pid:
                continue
            for t in sorted(os.listdir(f"/proc/{d}/task"), key=int):
                lines.append(f"{_task_cpu_s(int(d), int(t)):8.2f} s  child {d} task {t}")
        (self.dir / f"{tag}.child.txt").write_text("\n".join(lines) + "\n")

    def rep(self, rep: int, want: Sequence[str], label: str = "") -> list[Run]:
        """One repetition of the schedulers in ``want`` (order alternated by ``rep``), then the
        ceiling replaying the last complete, valid assignment; runs named ``label`` + name."""
        order = [s for s in (*SCHEDULERS, BASELINE) if s in want]
        if rep % 2:
            order.reverse()
        rep_runs = [self.run(s, rep) for s in order]
        if "ceiling" in want:
            good = [r for r in rep_runs if not r.violations and r.bound == self.expected]
            if good:
                rep_runs.append(self.run("ceiling", rep, good[-1].assignment))
            else:
                print("# ceiling: no complete, valid assignment to replay", file=sys.stderr)
        for r in rep_runs:
            r.scheduler = label + r.scheduler
        return rep_runs

    def _start_binder(self, ns: str, items: list[dict[str, Any]], replay: dict[str, str],
                      tag: str) -> subprocess.Popen[bytes]:
        plan = self.dir / f"{tag}.json"
        plan.write_text(json.dumps([[ns, p["metadata"]["name"], p["metadata"]["uid"],
                                     replay[p["metadata"]["name"]]] for p in items
                                    if p["metadata"]["name"] in replay]))
        log = open(self.dir / f"{tag}.log", "wb")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen([sys.executable, "-m", "tools.bench_k8s", "--binder",
                                 str(plan), "--kubeconfig", str(self.cp.kubeconfig)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                cwd=REPO, start_new_session=True, env=self.py_env(str(REPO)))
        log.close()
        assert proc.stdout is not None
        proc.stdout.readline()  # "ready": its start-up is not what the ceiling measures
        return proc


def binder(plan_file: str, kubeconfig: str, threads: int = 32) -> int:
    """The ceiling: bind a pre-decided plan with the lean path, as many at once as
    ``threads``, and queue one ``Scheduled`` event per binding to the same background event
    writers cfnet uses (what kube-scheduler does too: events never wait in line with
    bindings); exits once the events are written."""
    client = KubeClient.from_kubeconfig(kubeconfig)
    plan = json.loads(Path(plan_file).read_text())
    print("ready", flush=True)
    sys.stdin.readline()

    def one(item: list[str]) -> None:
        ns, name, uid, node = item
        client.bind_pod(ns, name, uid, node)
        client.record_event({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"namespace": ns, "name": name, "uid": uid}},
                            reason="Scheduled", message=f"Successfully assigned {ns}/{name} "
                            f"to {node}", action="Binding")

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, plan))
    client.flush_events(30.0)
    client.close()
    return 0


def _task_cpu_s(pid: int, tid: int) -> float:
    """CPU-seconds of one thread (utime + stime), from /proc; 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(rest[11]) + int(rest[12])) / TICK


def sampled(out: str, argv: list[str]) -> int:
    """Run ``cfnet-core argv`` (``cloud_core.main``, as the chart does) with a CPU profile of
    every thread: each thread gets a ``cProfile`` timed by its own CPU clock
    (``time.thread_time``), so a thread blocked in a C call (a socket read, a lock, a queue)
    costs nothing, unlike a wall-clock sampler that cannot tell waiting from working. At exit
    it writes: CPU per thread (grouped by name, from /proc), the MQTT child process's CPU
    per thread, and the functions by own CPU time and by cumulative CPU time over all
    threads. The profiler adds its own cost per call (about 2×): read the shares."""
    import cProfile
    import io
    import pstats
    import re
    import runpy

    profs: list[tuple[str, cProfile.Profile]] = []
    seen: dict[int, str] = {}  # native thread id -> name, for /proc
    orig_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        profs.append((self.name, prof))
        if self.native_id is not None:
            seen[self.native_id] = self.name
        prof.enable()
        try:
            orig_run(self)
        finally:
            prof.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    main_prof = cProfile.Profile(time.thread_time)
    profs.append(("MainThread", main_prof))
    seen[threading.get_native_id()] = "MainThread"
    last: dict[int, float] = {}
    me = os.getpid()
    stop = threading.Event()

    def poll() -> None:  # threads' CPU kept while they live (some end before the exit)
        while not stop.wait(0.5):
            for tid in list(seen):
                c = _task_cpu_s(me, tid)
                if c:
                    last[tid] = c

    threading.Thread(target=poll, daemon=True, name="profiler").start()

    def write(path: str) -> None:
        for tid in list(seen):
            last[tid] = _task_cpu_s(me, tid) or last.get(tid, 0.0)
        by_name: dict[str, float] = {}
        for tid, name in seen.items():
            group = re.sub(r"[_-]\d+(_\d+)?$", "",
                           re.sub(r"^Thread-\d+ \((.*)\)$", r"\1", name))
            by_name[group] = by_name.get(group, 0.0) + last.get(tid, 0.0)
        stats = None
        for _name, prof in profs:
            with contextlib.suppress(TypeError, ValueError):
                stats = pstats.Stats(prof) if stats is None else stats.add(prof)
        with open(path, "w") as f:
            f.write(f"process CPU {cpu_seconds(me):.2f} s; by thread (/proc):\n")
            for k, v in sorted(by_name.items(), key=lambda kv: -kv[1]):
                f.write(f"{v:8.2f} s  {k}\n")
            for stat in ("tottime", "cumulative"):
                buf = io.StringIO()
                if stats is not None:
                    stats.stream = buf  # type: ignore[attr-defined]
                    stats.sort_stats(stat).print_stats(60)
                f.write(f"-- functions by {stat} (thread CPU clock) --\n{buf.getvalue()}")

    # the bench's SIGUSR1 when it sees the first binding: the start-up's own table
    signal.signal(signal.SIGUSR1, lambda *_: write(out.replace(".prof.", ".first.prof.")))
    sys.argv = ["cloud_core.main", *argv]
    main_prof.enable()
    try:
        runpy.run_module("cloud_core.main", run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        main_prof.disable()
        stop.set()
        write(out)
    return 0


def authz(a: argparse.Namespace, want: Sequence[str]) -> int:
    """The same schedulers on one control plane per ``--authorization-mode`` in ``a.authz``
    (all started, each with its nodes), repetitions alternated between them: what the
    authorizer costs the API server (its CPU per pod is the figure a loaded machine keeps)."""
    modes = [m.strip() for m in a.authz.split("/") if m.strip()]
    runs: list[Run] = []
    with contextlib.ExitStack() as stack:
        benches = []
        for m in modes:
            cp = stack.enter_context(ControlPlane(authorization_mode=m))
            b = Bench(cp, a)
            stack.callback(b.broker.stop)
            b.setup()
            benches.append((m, b))
        for rep in range(a.reps):
            for m, b in (benches if rep % 2 == 0 else benches[::-1]):
                runs.extend(b.rep(rep, want, f"[{m}] "))
    names = [f"[{m}] {s}" for m in modes for s in (*SCHEDULERS, BASELINE, "ceiling")]
    print(table(runs, names, a.nodes, a.pods))
    print()
    print(f"Median (min–max) of {a.reps} repetitions per authorization mode, modes "
          "alternated; kube-apiserver CPU per pod is the figure that holds on a loaded "
          "machine.")
    return 0 if all(not r.violations for r in runs) else 1


# -- report ------------------------------------------------------------------------------------
def _med(xs: Sequence[float], fmt: str) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "–"
    m = statistics.median(xs)
    if len(xs) == 1:
        return format(m, fmt)
    return f"{format(m, fmt)} ({format(min(xs), fmt)}–{format(max(xs), fmt)})"


def table(runs: Sequence[Run], names: Sequence[str], nodes: int, pods: int,
          kwok: bool = False) -> str:
    """The runs' medians (min–max) by scheduler; with ``kwok``, also pods/s to Running and
    the first pod Running (created → Running, kwok's nodes)."""
    lines = [f"| scheduler ({nodes} nodes / {pods} pods) | pods/s | pods/s after 1st | "
             "first binding s | CPU s to 1st binding | scheduler CPU s | "
             "scheduler ms/pod | ms/pod after 1st | kube-apiserver CPU s | apiserver ms/pod | "
             + ("pods/s to Running | first Running s | Running | " if kwok else "")
             + "bound | violations |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
             + ("---:|---:|---:|" if kwok else "") + "---:|---:|"]
    for n in names:
        rs = [r for r in runs if r.scheduler == n]
        if not rs:
            continue
        after = [1000 * (r.sched_cpu_s - r.first_cpu_s) / max(r.bound - 1, 1) for r in rs]
        lines.append(
            f"| {n} | {_med([r.rate for r in rs], '.0f')} | "
            f"{_med([r.steady for r in rs], '.0f')} | "
            f"{_med([r.first_s for r in rs], '.2f')} | "
            f"{_med([r.first_cpu_s for r in rs], '.2f')} | "
            f"{_med([r.sched_cpu_s for r in rs], '.1f')} | "
            f"{_med([1000 * r.sched_cpu_s / max(r.bound, 1) for r in rs], '.2f')} | "
            f"{_med(after, '.2f')} | "
            f"{_med([r.api_cpu_s for r in rs], '.1f')} | "
            f"{_med([1000 * r.api_cpu_s / max(r.bound, 1) for r in rs], '.2f')} | "
            + (f"{_med([r.running_rate for r in rs], '.0f')} | "
               f"{_med([r.first_running_s for r in rs], '.2f')} | "
               f"{min(r.running for r in rs)}/{pods} | " if kwok else "")
            + f"{min(r.bound for r in rs)}/{pods} | {max(len(r.violations) for r in rs)} |")
    return "\n".join(lines)


SCHEDULERS = ("kube-scheduler", "kube-scheduler, QPS 5000", "cfnet")
# --arrival: the tuned kube-scheduler and cfnet (kube-scheduler's default client QPS of 50
# caps what it can bind per second, so it runs only when --only names it)
ARRIVAL = (SCHEDULERS[1], SCHEDULERS[2])
ANSWERS_WAIT_S = 10.0  # --unschedulable: how long a run waits for cfnet's answers
ARRIVAL_THREADS = 32  # creators: pods are due faster than one create call returns
BASELINE = "cfnet, baseline tree"
SHORT = {SCHEDULERS[0]: "kube", SCHEDULERS[1]: "kube-qps", SCHEDULERS[2]: "cfnet",
         BASELINE: "cfnet-base", "ceiling": "ceiling"}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_k8s",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="100 nodes / 500 pods, 3 reps")
    ap.add_argument("--only", default="", help="comma list of: kube,kube-qps,cfnet,ceiling")
    ap.add_argument("--stall-s", type=float, default=30.0,
                    help="give up a run after this long without a new binding")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--cfnet-arg", action="append", default=[],
                    help="extra argument for cfnet-core --kubernetes (repeatable)")
    ap.add_argument("--baseline-tree", default="",
                    help="also run cfnet from this source tree (e.g. /work/main: before/after)")
    ap.add_argument("--profile", action="store_true",
                    help="sample cfnet's threads every 2 ms (tables in the run's temp dir)")
    ap.add_argument("--authz", default="",
                    help="compare API server authorizers, e.g. 'Node,RBAC/RBAC': one control "
                         "plane each (the same nodes), repetitions alternated between them")
    ap.add_argument("--kwok", action="store_true",
                    help="the nodes are kwok's (sigs.k8s.io/kwok, its fast stages): pods "
                         "also go Running, and the table times created -> Running too")
    ap.add_argument("--arrival", default="",
                    help="pods/s, comma list (e.g. 20,200): after the burst runs (none with "
                         "--pods 0), pods created at that rate on a running scheduler")
    ap.add_argument("--arrival-seconds", type=float, default=30.0)
    ap.add_argument("--arrival-max-pods", type=int, default=10000,
                    help="at most this many pods per arrival run")
    ap.add_argument("--unschedulable", type=float, default=0.0, metavar="PERCENT",
                    help="this share of the pods fits no node (a run waits for the others)")
    ap.add_argument("--field-mix", action="store_true",
                    help="every 2nd node edge-tainted and carrying the older "
                         "cfnet.io/security-level label; every 3rd pod but the spread ones "
                         "requires a region")
    ap.add_argument("--background", type=int, default=0,
                    help="pods bound to the Nodes directly before the runs (a steady load)")
    ap.add_argument("--sample-to", help=argparse.SUPPRESS)
    ap.add_argument("--binder", help=argparse.SUPPRESS)
    ap.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    if argv is None and "--sample-to" in sys.argv:
        i = sys.argv.index("--")
        return sampled(sys.argv[sys.argv.index("--sample-to") + 1], sys.argv[i + 1:])
    a = ap.parse_args(argv)
    if a.binder:
        return binder(a.binder, a.kubeconfig)
    if a.quick:
        a.nodes, a.pods = 100, 500
    if a.baseline_tree and not a.only:
        a.only = "kube,kube-qps,cfnet,cfnet-base,ceiling"
    keys = {v: k for k, v in SHORT.items()}
    want = [keys[k.strip()] for k in a.only.split(",") if k.strip()] if a.only else \
        [*SCHEDULERS, "ceiling"]
    if a.baseline_tree and "cfnet" in want and BASELINE not in want:
        want.append(BASELINE)  # a baseline tree is there to alternate with
    runs: list[Run] = []
    # The schedulers run in sessions of their own (so a Ctrl-C reaches them only through us):
    # turn SIGTERM into SystemExit as well, so the finally blocks stop them and the control
    # plane instead of leaving them running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.authz:
        return authz(a, want)
    with ControlPlane() as cp, contextlib.ExitStack() as stack:
        if a.kwok:
            stack.enter_context(Kwok(cp))
        b = Bench(cp, a)
        try:
            b.setup()
            if a.background:
                b.background(a.background)
            for rep in range(a.reps if a.pods > 0 else 0):
                runs.extend(b.rep(rep, want))
            arrivals = arrival_runs(b, a, want)
        finally:
            b.broker.stop()
    if runs:
        print(table(runs, [*SCHEDULERS, BASELINE, "ceiling"], a.nodes, a.pods, a.kwok))
        print()
        print(f"Median (min–max) of {a.reps} repetitions, order alternated; pods/s from the "
              "scheduler's start to its last binding of a backlog created beforehand (the "
              "ceiling's clock starts after its start-up); CPU from /proc over the same span; "
              "violations by the bench's own checker.")
        if a.unschedulable:
            answered = [r.answered for r in runs if r.scheduler.startswith("cfnet")]
            print(f"{a.unschedulable:g} % of the pods fit no node ({a.pods - b.expected}); "
                  "each run ends at the last binding of the others. FailedScheduling events "
                  "with cfnet's answer per cfnet run: "
                  + ", ".join(f"{r.scheduler} {r.answered}" for r in runs
                              if r.scheduler.startswith("cfnet"))
                  + (f" (median {statistics.median(answered):g})" if answered else "") + ".")
    if arrivals:
        print()
        print(arrival.table(arrivals, [s for s in (*SCHEDULERS, BASELINE) if s in want],
                            a.nodes, a.background))
        print()
        print(f"Median (min–max) of {a.reps} repetitions, order alternated; pods created at "
              f"the rate for {a.arrival_seconds:g} s (at most {a.arrival_max_pods}), each timed "
              "from its create call's return to the watch seeing it bound; CPU over the "
              "arrival window (from the first create to the last binding) per pod bound.")
    print(f"# logs and profiles: {b.dir}", file=sys.stderr)
    bad = any(r.violations for r in runs) or any(r.violations for r in arrivals)
    return 1 if bad else 0


def arrival_runs(b: Bench, a: argparse.Namespace, want: Sequence[str]
                 ) -> list[arrival.ArrivalRun]:
    """``--arrival``: per rate and repetition, each arrival scheduler in ``want`` (order
    alternated by repetition), and cfnet from ``--baseline-tree`` beside cfnet's."""
    names = [s for s in (*SCHEDULERS, BASELINE) if s in want
             and (s in ARRIVAL or a.only or s == BASELINE)]
    out: list[arrival.ArrivalRun] = []
    for rate in [float(x) for x in a.arrival.split(",") if x.strip()]:
        for rep in range(a.reps):
            for n in names if rep % 2 == 0 else names[::-1]:
                out.append(b.arrival_run(n, rep, rate))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
