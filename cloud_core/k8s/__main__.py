"""``python -m cloud_core.k8s``: run the Kubernetes actuator with Lease-based leader election.

Credentials: ``--kubeconfig``, or ``--server`` + ``--token-file`` (+ ``--ca``), or the
in-cluster ServiceAccount. Prints one JSON line per lifecycle event on stdout (``started``,
``leading``, ``ready``, ``synced``, ``following``, ``stats``) so supervisors and tests can
follow it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from cloud_core.errors import CoreError
from cloud_core.k8s.actuator import Actuator, ActuatorConfig, tune_gc
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.flags import add_scheduler_args, scheduler_engine_config
from cloud_core.k8s.leader import LeaderElector
from cloud_core.k8s.registry import NodeRegistry, RegistryConfig

_SAY_LOCK = threading.Lock()


def _say(event: str, **kw: Any) -> None:
    """One JSON line on stdout. Whole lines under a lock: the leader-election thread's
    "leading" and the main thread's "started" come at the same moment, and ``print`` writes
    the text and its newline separately, so two lines could interleave into one that no
    reader parses (CI lost a "leading" so)."""
    line = json.dumps({"event": event, "t": time.time(), **kw}) + "\n"
    with _SAY_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def make_client(args: argparse.Namespace) -> KubeClient:
    if args.kubeconfig:
        return KubeClient.from_kubeconfig(args.kubeconfig)
    if args.server and args.token_file:
        with open(args.token_file) as f:
            return KubeClient.from_token(args.server, f.read().strip(), args.ca)
    return KubeClient.in_cluster()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cloud_core.k8s", description=__doc__)
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    p.add_argument("--server")
    p.add_argument("--token-file")
    p.add_argument("--ca")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname())
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "cfnet-system"))
    p.add_argument("--lease-name", default="cfnet-core")
    p.add_argument("--lease-duration", type=float, default=15.0)
    p.add_argument("--renew-deadline", type=float, default=10.0)
    p.add_argument("--retry-period", type=float, default=2.0)
    p.add_argument("--edge-taint", choices=["respect", "ignore"], default="respect")
    p.add_argument("--stats-every", type=float, default=0.0)
    p.add_argument("--log-bindings", action="store_true", help="print a line per binding")
    add_scheduler_args(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        client = make_client(args)
    except (CoreError, OSError) as e:
        print(f"cfnet k8s actuator: {e}", file=sys.stderr)
        return 2
    def leading() -> None:
        _say("leading", identity=args.identity)
        act.wake()  # pods that arrived while following are waiting: don't sleep on them

    elector = LeaderElector(client, args.lease_namespace, args.lease_name, args.identity,
                            lease_duration_s=args.lease_duration,
                            renew_deadline_s=args.renew_deadline,
                            retry_period_s=args.retry_period,
                            on_started=lambda: leading(),
                            on_stopped=lambda: _say("following", identity=args.identity))
    engine = scheduler_engine_config(args)
    tune_gc()
    act = Actuator(client, NodeRegistry(RegistryConfig(edge_taint=args.edge_taint)),
                   ActuatorConfig(identity=args.identity, engine_config=engine),
                   is_leader=elector.is_leader,
                   on_alert=lambda a: _say("alert", **a),
                   on_bound=(lambda k, n: _say("bound", pod=k, node=n)) if args.log_bindings
                   else None)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    act.start()
    elector.start()
    _say("started", identity=args.identity)

    def synced() -> None:
        if act.wait_ready(600):
            _say("ready")  # nodes and bound pods listed: deciding starts
        if act.wait_synced(600):
            _say("synced")

    threading.Thread(target=synced, daemon=True, name="synced").start()
    while not done.wait(args.stats_every or 3600):
        s = act.stats
        _say("stats", bound=s.bound, conflicts=s.conflicts, failed=s.failed_scheduling)
    elector.stop(release=True)
    act.stop()
    _say("stopped", identity=args.identity, bound=act.stats.bound)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
