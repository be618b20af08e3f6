"""Queue starvation on a shared cluster: can one tenant's backlog hide another tenant's pod?

One control plane (``tools.envtest.ControlPlane``), a few Nodes; per run and scheduler tree:

* tenant ``noisy`` creates ``--backlog`` (1,000) *distinct* pods that fit no node (each asks
  for a different, too large amount of cpu: no two share an equivalence class), and waits
  until the scheduler has tried them all (a FailedScheduling event for each, or 90 s);
* then, for ``--seconds``, the same tenant deletes ``--deletions`` (20) bound pods a second
  (and creates as many: bound with ``nodeName``, another scheduler's), and tenant ``canary``
  creates one ordinary pod a second; the bench polls when each canary is bound.

Reported per tree: the canaries' creation→binding latency (median, p99, max; a canary still
unbound at the end counts as the run's length and is counted as "unbound"), and the CPU-seconds
the scheduler process spent during the measured window (``/proc``, utime + stime). The
scheduler is ``python -m cloud_core.k8s`` started from this tree and, as the baseline measured
in the same run, from ``--baseline-rev`` (default ``main``; exported with ``git archive``).

    python -m tools.bench_starvation [--backlog 1000 --deletions 20 --seconds 30]
                                     [--baseline-rev main | --no-baseline] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
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

from cloud_core.errors import KubeError
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.registry import SECURITY
from tools.envtest import ControlPlane

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
NODES = 4


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(rest[11]) + int(rest[12])) / TICK


def _pod(name: str, ns: str, cpu: str, *, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "registry.example/app:1",
                                            "resources": {"requests": {"cpu": cpu,
                                                                       "memory": "64Mi"}}}]}
    if node is None:
        spec["schedulerName"] = "cfnet-scheduler"
    else:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}}, "spec": spec}


@dataclass
class Run:
    tree: str
    latencies: list[float] = field(default_factory=list)
    unbound: int = 0
    cpu_s: float = float("nan")
    deletions: int = 0
    tried: int = 0  # backlog pods with a FailedScheduling event before the window


class Bench:
    def __init__(self, cp: ControlPlane, args: argparse.Namespace) -> None:
        self.cp = cp
        self.a = args
        self.admin = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        self.dir = Path(tempfile.mkdtemp(prefix="cfnet-bench-starve-"))

    def setup(self) -> None:
        for j in range(NODES):
            name = f"starve-{j}"
            status = {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "500"},
                      "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "500"},
                      "conditions": [{"type": "Ready", "status": "True"}]}
            obj = self.admin.create("/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                      "topology.kubernetes.io/region": "eu",
                                                      "topology.kubernetes.io/zone": "eu-a",
                                                      SECURITY: "1"}},
                "status": status})
            obj["status"] = status
            obj = self.admin.replace(f"/api/v1/nodes/{name}/status", obj)
            self.admin.patch(f"/api/v1/nodes/{name}", [
                {"op": "replace", "path": "/spec/taints", "value": []}],
                content_type="application/json-patch+json")

    def tree(self, label: str) -> str:
        if label == "this tree":
            return str(REPO)
        out = self.dir / "baseline"
        if not out.exists():
            out.mkdir()
            arch = subprocess.run(["git", "-C", str(REPO), "archive", self.a.baseline_rev],
                                  check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(out)], input=arch, check=True)
        return str(out)

    def run(self, label: str, rep: int) -> Run:
        tree = self.tree(label)
        tag = f"{'base' if label != 'this tree' else 'new'}-{rep}-{os.getpid() % 10000}"
        noisy, canary = f"noisy-{tag}", f"canary-{tag}"
        for ns in (noisy, canary):
            self.cp.ensure_namespace(ns)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=tree, PYTHONPYCACHEPREFIX=str(self.dir / f"pycache-{label[:4]}"))
        # Compile once, not timed, as a deployed image ships its compiled files: a fresh
        # cache prefix otherwise compiled pandas (under cp_model) in the middle of a step,
        # a 17-22 s stall that was the canary's p99.
        subprocess.run([sys.executable, "-c", "import cloud_core.main, cloud_core.k8s.wiring, "
                        "cloud_core.placement.solver, ortools.sat.python.cp_model"],
                       check=True, env=env, cwd=tree)
        log = open(self.dir / f"{tag}.log", "wb")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "cloud_core.k8s", "--kubeconfig", str(self.cp.kubeconfig),
             "--identity", f"bench-{tag}", "--lease-namespace", noisy, "--lease-name", "lease",
             "--retry-period", "0.5"], stdout=log, stderr=log, env=env, cwd=tree,
            start_new_session=True)
        log.close()
        r = Run(label)
        stop = threading.Event()
        try:
            path = f"/api/v1/namespaces/{noisy}/pods"
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda i: self.admin.create(path, _pod(
                    f"big-{i}", noisy, f"{1000 + i}")), range(self.a.backlog)))
                # bound pods to delete (another scheduler's: nodeName set)
                pool = [f"busy-{i}" for i in range(int(self.a.deletions * 3))]
                list(ex.map(lambda n: self.admin.create(path, _pod(
                    n, noisy, "10m", node=f"starve-{hash(n) % NODES}")), pool))
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                evs = self.admin.list(f"/api/v1/namespaces/{noisy}/events")[0]
                r.tried = len({e["involvedObject"]["name"] for e in evs
                               if e.get("reason") == "FailedScheduling"})
                if r.tried >= self.a.backlog:
                    break
                time.sleep(0.5)
            churn = threading.Thread(target=self._churn, args=(noisy, pool, stop, r),
                                     daemon=True)
            cpu0 = cpu_seconds(proc.pid)
            churn.start()
            created: dict[str, float] = {}
            bound: dict[str, float] = {}
            t_end = time.monotonic() + self.a.seconds
            nxt = time.monotonic()
            i = 0
            while time.monotonic() < t_end:
                if time.monotonic() >= nxt:
                    name = f"canary-{i}"
                    created[name] = time.monotonic()
                    self.admin.create(f"/api/v1/namespaces/{canary}/pods",
                                      _pod(name, canary, "100m"))
                    i += 1
                    nxt += 1.0
                for p in self.admin.list(f"/api/v1/namespaces/{canary}/pods")[0]:
                    n = p["metadata"]["name"]
                    if (p.get("spec") or {}).get("nodeName") and n not in bound:
                        bound[n] = time.monotonic()
                time.sleep(0.05)
            r.cpu_s = cpu_seconds(proc.pid) - cpu0
            stop.set()
            churn.join(10)
            for n, t in created.items():
                if n in bound:
                    r.latencies.append(bound[n] - t)
                else:
                    r.unbound += 1
                    r.latencies.append(t_end - t)
        finally:
            stop.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            for ns in (noisy, canary):
                with contextlib.suppress(KubeError):
                    self.admin.delete(f"/api/v1/namespaces/{ns}")
        return r

    def _churn(self, ns: str, pool: list[str], stop: threading.Event, r: Run) -> None:
        """Delete one bound pod and create its successor, ``--deletions`` times a second
        (the calls go out on a few threads, so a slow answer does not lower the rate)."""
        path = f"/api/v1/namespaces/{ns}/pods"
        period = 1.0 / self.a.deletions
        nxt = time.monotonic()
        k = len(pool)
        lock = threading.Lock()

        def delete(victim: str) -> None:
            with contextlib.suppress(KubeError):
                self.admin.delete(f"{path}/{victim}", grace_period_s=0)
                with lock:
                    r.deletions += 1

        def create(name: str, node: str) -> None:
            with contextlib.suppress(KubeError):
                self.admin.create(path, _pod(name, ns, "10m", node=node))

        with ThreadPoolExecutor(6) as ex:
            while not stop.is_set():
                ex.submit(delete, pool.pop(0))
                name = f"busy-{k}"
                ex.submit(create, name, f"starve-{k % NODES}")
                k += 1
                pool.append(name)
                nxt += period
                stop.wait(max(0.0, nxt - time.monotonic()))


def _pct(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def table(runs: Sequence[Run], args: argparse.Namespace) -> str:
    head = ("| scheduler | canaries | unbound | latency p50 (s) | p99 (s) | max (s) | "
            "core CPU-s | core CPU % | deletions/s | backlog tried |")
    lines = [head, "|" + "---|" * 10]
    for label in dict.fromkeys(r.tree for r in runs):
        rs = [r for r in runs if r.tree == label]
        lat = [x for r in rs for x in r.latencies]
        cpu = [r.cpu_s for r in rs]
        lines.append(
            f"| cfnet, {label} | {len(lat)} | {sum(r.unbound for r in rs)} | "
            f"{statistics.median(lat):.2f} | {_pct(lat, 0.99):.2f} | {max(lat):.2f} | "
            f"{statistics.median(cpu):.1f} ({min(cpu):.1f}–{max(cpu):.1f}) | "
            f"{100 * statistics.median(cpu) / args.seconds:.0f} | "
            f"{statistics.median(r.deletions for r in rs) / args.seconds:.1f} | "
            f"{min(r.tried for r in rs)}/{args.backlog} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backlog", type=int, default=1000)
    ap.add_argument("--deletions", type=float, default=20.0, help="per second")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured window per run")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--baseline-rev", default="main")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--quick", action="store_true", help="300 pods, 15 s (make bench)")
    a = ap.parse_args(argv)
    if a.quick:
        a.backlog, a.seconds = 300, 15.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    labels = ["this tree"] + ([] if a.no_baseline else [f"baseline {a.baseline_rev}"])
    runs: list[Run] = []
    with ControlPlane(controllers=False) as cp:  # nothing here needs a controller
        b = Bench(cp, a)
        b.setup()
        for rep in range(a.reps):
            order = labels if rep % 2 == 0 else labels[::-1]
            for label in order:
                runs.append(b.run(label, rep))
                print(f"# {label} rep {rep}: done", file=sys.stderr, flush=True)
    print(table(runs, a))
    print()
    print(f"{a.backlog} distinct unschedulable pods in one namespace, {a.deletions:g} "
          f"deletions/s of bound pods there, one canary pod a second in another namespace for "
          f"{a.seconds:g} s; latency from the canary's creation to seeing it bound (polled "
          f"every 50 ms; an unbound canary counts as the time left in the window). "
          f"{a.reps} repetition(s), order alternated. Logs: {b.dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
