"""`cfnet-core`: parse the command line, wire the core's parts, run until a signal.

With ``--kubernetes`` the first lists (Nodes, pods) are asked for right after the command
line is parsed, before the rest of the core (the placement engine with numpy and OR-Tools,
SQLite, the MQTT child, the metrics server) is imported and started: the API server answers
while the interpreter imports (``k8s/prefetch.py``; the first binding at 5,000 Nodes,
``tools/bench_k8s.py``). So this module imports at its top only what parsing needs.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloud_core.broker_args import add_broker_args, broker_settings
from cloud_core.errors import CoreError
from cloud_core.k8s.flags import (
    add_eviction_args,
    add_scheduler_args,
    eviction_policy,
    scheduler_engine_config,
)
from cloud_core.k8s.lines import no_line, say_line
from edge_agent.wire.logsetup import LOG_FORMATS, add_version_flag, configure_logging

if TYPE_CHECKING:
    from cloud_core.k8s.client import KubeClient
    from cloud_core.k8s.enroll import EnrollLoop
    from cloud_core.k8s.leader import LeaderElector
    from cloud_core.k8s.prefetch import FirstLists
    from cloud_core.k8s.wiring import KubeRunner
    from cloud_core.readiness import Check
    from cloud_core.service import CoreConfig, CoreService

log = logging.getLogger("cfnet.core")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="cfnet-core", description="cfnet cloud core")
    add_version_flag(p)
    add_broker_args(p)
    p.add_argument("--log-format", choices=LOG_FORMATS, default=env("CFNET_LOG_FORMAT", "text"),
                   help="text (default) or json: one JSON object per line")
    p.add_argument("--username", default=env("CFNET_USERNAME", "core-0"))
    p.add_argument("--db", type=Path, default=Path(env("CFNET_DB", "/var/lib/cfnet-core/core.db")),
                   help="SQLite database: workloads, placements, journal, audit")
    p.add_argument("--registry", type=Path, default=env("CFNET_REGISTRY"),
                   help="YAML node registry (region, zone, security level, price, carbon)")
    p.add_argument("--roles", type=Path, default=env("CFNET_ROLES"),
                   help="YAML mapping operator -> viewer|operator|admin")
    p.add_argument("--share-group", default=env("CFNET_SHARE_GROUP"),
                   help="ingest through $share/<group>/ so replicas split the load")
    p.add_argument("--nats-url", default=env("CFNET_NATS_URL", ""),
                   help="with --bus nats: the servers' NATS URLs (tls://host:4222,...): the "
                        "console's retained-request check and, with --share-group, ingest "
                        "shared through JetStream")
    p.add_argument("--nats-replicas", type=int, default=int(env("CFNET_NATS_REPLICAS", "3")),
                   help="replicas of the shared-ingest stream (the NATS cluster's size)")
    p.add_argument("--nats-sites", default=env("CFNET_NATS_SITES", ""),
                   help="with --bus nats and --share-group: edge sites (their leaf nodes' "
                        "JetStream domains, a,b,...) whose stream the core creates on the "
                        "leaf and sources into its ingest stream (docs/nats.md)")
    p.add_argument("--step-interval", type=float, default=0.5)
    p.add_argument("--apply-interval", type=float, default=0.0,
                   help="pause between node applies (paces large roll-outs)")
    p.add_argument("--no-place", action="store_true", help="ingest only (follower replica)")
    p.add_argument("--mqtt-in-process", action="store_true",
                   help="keep the MQTT connection in the core's own process (default: a "
                        "child process, so receiving and ingesting use two CPUs)")
    p.add_argument("--ack-interval", type=float, default=1.0,
                   help="seconds between end-to-end acks to each reporting agent")
    p.add_argument("--metrics-port", type=int, default=env("CFNET_METRICS_PORT"),
                   help="serve Prometheus metrics on this port (default: off)")
    k = p.add_argument_group("Kubernetes (place pods with schedulerName: cfnet-scheduler)")
    k.add_argument("--kubernetes", action="store_true",
                   help="actuate through the Kubernetes API instead of MQTT placement topics")
    k.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                   help="kubeconfig file (default: the in-cluster ServiceAccount)")
    k.add_argument("--identity", default=env("POD_NAME") or socket.gethostname(),
                   help="this replica's name in the leader Lease")
    k.add_argument("--lease-namespace", default=env("POD_NAMESPACE", "cfnet-system"))
    k.add_argument("--lease-name", default=env("CFNET_LEASE_NAME", "cfnet-core"),
                   help="the leader Lease's name (the chart's core.lease.name)")
    k.add_argument("--lease-duration", type=float, default=15.0)
    k.add_argument("--renew-deadline", type=float, default=None,
                   help="seconds (default: 2/3 of the lease duration)")
    k.add_argument("--retry-period", type=float, default=None,
                   help="seconds (default: the lease duration / 7.5, at least 1)")
    k.add_argument("--json-lines", action="store_true",
                   help="one JSON line per lifecycle event on stdout (started, leading, ready, "
                        "synced, following, stats, stopped), for supervisors and tests")
    k.add_argument("--log-bindings", action="store_true",
                   help="with --json-lines: also a line per binding")
    k.add_argument("--stats-every", type=float, default=0.0,
                   help="with --json-lines: a stats line every N seconds (0: never)")
    k.add_argument("--edge-taint", choices=("respect", "ignore"), default="respect",
                   help="KubeEdge's edge taint: respect it (pods need a toleration) or ignore it")
    k.add_argument("--agent-ca-secret", default=env("CFNET_AGENT_CA_SECRET"),
                   help="NAMESPACE/NAME of the agent CA's Secret (kubernetes.io/tls; made "
                        "when missing): the leader approves and signs the agents' CSRs "
                        "(signer cfnet.io/agent; docs/security.md, 'One identity per "
                        "agent'). Default: off")
    k.add_argument("--agent-service-account",
                   default=env("CFNET_AGENT_SERVICE_ACCOUNT", ""),
                   help="NAMESPACE:NAME of the agents' ServiceAccount, the only requester "
                        "whose CSRs are approved (default: <lease namespace>:cfnet-agent)")
    k.add_argument("--agent-cert-days", type=int,
                   default=int(env("CFNET_AGENT_CERT_DAYS", "365")),
                   help="lifetime of an agent certificate (the agent renews it in its "
                        "last third)")
    add_scheduler_args(k)
    add_eviction_args(k)
    p.add_argument("--table-every", type=float, default=10.0,
                   help="log the node and link tables every N seconds (0: never)")
    return p.parse_args(argv)


def load_roles(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    import yaml  # only with a roles file: 40 ms of start-up before the first lists

    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CoreError(f"cannot read roles file {path}: {exc}") from exc
    ops = raw.get("operators", raw) if isinstance(raw, dict) else None
    if not isinstance(ops, dict) or any(v not in ("viewer", "operator", "admin")
                                        for v in ops.values()):
        raise CoreError(f"{path}: expected operators: {{name: viewer|operator|admin}}")
    return {str(k): str(v) for k, v in ops.items()}


def build_config(a: argparse.Namespace) -> CoreConfig:
    from cloud_core.bus_nats import NatsIngestSettings
    from cloud_core.bus_nats_sites import parse_sites
    from cloud_core.registry import load_registry
    from cloud_core.service import CoreConfig

    session: dict[str, Any] = {}
    if a.share_group and a.bus == "mosquitto":
        # A `$share` member with a persistent session keeps being handed its share while it
        # is gone (Mosquitto queues for the offline session), so a dead replica's nodes went
        # stale on the others until the session expired (1 h; docs/scale.md). Without a
        # session a member leaves the group as its connection drops; what it took and had
        # not acknowledged, the agents resend (end-to-end acks).
        session = {"session_expiry_s": 0, "clean_start": True}
    settings = broker_settings(a, a.username, client_id=a.username, keepalive_s=5, **session)
    nats = None
    sites = parse_sites(a.nats_sites or "")
    if sites and not (a.bus == "nats" and a.share_group):
        raise CoreError("--nats-sites needs --bus nats and --share-group (the core links "
                        "sites from its shared-ingest connection)")
    urls = tuple(u.strip() for u in a.nats_url.split(",") if u.strip())
    console = not a.no_place
    nats_console = None
    if a.bus == "nats" and console:
        from cloud_core.bus_retained import NatsLogin

        if not urls:
            raise CoreError("--bus nats needs --nats-url (CFNET_NATS_URL): the console asks "
                            "the bus's retained store whether a request was published with "
                            "retain (MQTT 3.1.1 does not say)")
        nats_console = NatsLogin(urls=urls, username=a.username, password=settings.password,
                                 ca_file=a.ca_file)
    if a.bus == "nats" and a.share_group:
        if not urls:
            raise CoreError("--bus nats with --share-group needs --nats-url (CFNET_NATS_URL)")
        if a.mqtt_in_process:
            raise CoreError("--share-group on NATS needs the MQTT process "
                            "(drop --mqtt-in-process)")
        nats = NatsIngestSettings(urls=urls, username=a.username, password=settings.password,
                                  ca_file=a.ca_file, replicas=a.nats_replicas, sites=sites)
    return CoreConfig(
        mqtt=settings, db_path=a.db, registry=load_registry(a.registry),
        roles=load_roles(a.roles), step_interval_s=a.step_interval,
        apply_interval_s=a.apply_interval, share_group=a.share_group,
        # With Kubernetes, pods are placed by the actuator below, not by the local loop.
        place=not (a.no_place or a.kubernetes), console=console, nats_console=nats_console,
        metrics_port=int(a.metrics_port) if a.metrics_port is not None else None,
        mqtt_process=not a.mqtt_in_process, ack_interval_s=a.ack_interval, nats=nats,
    )


def broker_check(core: CoreService, leading: Callable[[], bool] | None) -> Check:
    """Readiness: connected to the broker (a Kubernetes follower does not connect)."""

    def check() -> str | None:
        if leading is not None and not leading():
            return None
        if core.mqtt.connected:
            return None
        return f"not connected to the broker ({core.mqtt.last_refusal or 'no answer'})"

    return check


def api_check(elector: LeaderElector, max_age_s: float,
              clock: Callable[[], float] = time.time) -> Check:
    """Readiness: the API server answered the election within ``max_age_s``."""

    def check() -> str | None:
        if not elector.last_contact:
            return "no answer from the API server yet"
        age = clock() - elector.last_contact
        if age > max_age_s:
            return f"no answer from the API server for {age:.0f}s"
        return None

    return check


def kube_client(a: argparse.Namespace) -> KubeClient | None:
    """The Kubernetes client ``--kubeconfig`` (or the in-cluster ServiceAccount) names;
    None, said in the log, when it cannot be set up."""
    from cloud_core.k8s.client import KubeClient

    try:
        return (KubeClient.from_kubeconfig(a.kubeconfig) if a.kubeconfig
                else KubeClient.in_cluster())
    except (CoreError, OSError) as exc:
        log.error("cannot reach the Kubernetes API: %s", exc)
        return None


def main(argv: list[str] | None = None) -> int:
    configure_logging("text")
    a = parse_args(argv)
    configure_logging(a.log_format)
    client: KubeClient | None = None
    first: FirstLists | None = None
    if a.kubernetes:
        # the Kubernetes client first, and the actuator's first lists asked for now: the
        # API server answers them while the rest is imported and started (prefetch.py)
        from cloud_core.k8s.gc_tuning import tune_gc
        from cloud_core.k8s.prefetch import FirstLists

        tune_gc()  # before the lists and the imports: the core is this process (gc_tuning)
        client = kube_client(a)
        if client is None:
            return 2
        first = FirstLists(client)
    from cloud_core.service import CoreService

    try:
        cfg = build_config(a)
        core = CoreService(cfg)
    except CoreError as exc:
        print(f"cfnet-core: {exc}", file=sys.stderr)
        if first is not None:
            first.close()
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # On Kubernetes, replicas share one MQTT account and take turns: only the
    # Lease holder connects (see CoreService.connect).
    core.start(connect=not a.kubernetes)
    kube = None
    enroll: EnrollLoop | None = None
    say = say_line if a.json_lines else no_line
    if client is not None:
        kube = start_kube(a, client, core, say, first)
        if a.agent_ca_secret:
            enroll = start_enroll(a, client, core, kube.elector)
            if enroll is None:
                kube.stop()
                core.stop()
                return 2
    else:
        core.metrics.readiness.add("broker", broker_check(core, None))
    core.metrics.readiness.started()
    pending = len(core.store.workloads(("planned",)))
    log.info("core %s up: db %s, %d registered nodes, %d planned placements to re-apply",
             a.username, a.db, len(cfg.registry.nodes), pending)
    if not a.kubernetes and not core.mqtt.wait_connected(10):
        log.warning("broker %s:%s not reachable yet (%s); retrying in the background",
                    a.broker_host, a.broker_port, core.mqtt.last_refusal or "no answer")
    serve(a, core, kube, stop, say)
    if kube is not None:
        # The Lease first: a standby takes over while the rest of this replica winds down.
        kube.elector.stop(release=True)
    if enroll is not None:
        enroll.stop()
    if kube is not None:
        kube.stop()
        say("stopped", identity=a.identity, bound=kube.actuator.stats.bound)
    core.stop()
    return 0


def start_kube(a: argparse.Namespace, client: KubeClient, core: CoreService,
               say: Callable[..., None], first: FirstLists | None) -> KubeRunner:
    """Place through the Kubernetes API: the actuator, the election, their counters on
    /metrics and their readiness checks."""
    # Imported here: the kubernetes client is only needed in this mode.
    from cloud_core.k8s import objects
    from cloud_core.k8s.wiring import KubeSettings, start_kubernetes
    from cloud_core.metrics import int_fields

    kube = start_kubernetes(client, core.state, core.events, KubeSettings(
        identity=a.identity, lease_namespace=a.lease_namespace, lease_name=a.lease_name,
        lease_duration_s=a.lease_duration,
        renew_deadline_s=a.renew_deadline or a.lease_duration * 2 / 3,
        retry_period_s=a.retry_period or max(1.0, a.lease_duration / 7.5),
        edge_taint=a.edge_taint, engine=scheduler_engine_config(a),
        eviction=eviction_policy(a)),
        on_lead=core.connect, on_follow=core.disconnect, console=core.console,
        say=say if a.json_lines else None, say_bindings=a.log_bindings, first=first)
    say("started", identity=a.identity)
    # The actuator's own counters (bound, conflicts, unavailable, ...) on /metrics.
    core.metrics.add_counters("cfnet_actuator_events", "Kubernetes actuator counters",
                              "event", int_fields(kube.actuator.stats))
    # FailedScheduling events' conflict answers (cloud_core/conflicts.py): pods unschedulable now
    # by the kind of each constraint of their minimal conflict, and how the answers went
    # (diagnosed; skipped: its queue was full; failed)
    core.metrics.add_gauges("cfnet_unschedulable_pods", "Unschedulable pods by conflicting "
                            "constraint", "constraint",
                            kube.actuator.binder.unschedulable_by_constraint)
    core.metrics.add_counters("cfnet_conflict_answers", "FailedScheduling events' conflict "
                              "answers", "outcome", kube.actuator.binder.conflict_answers)
    # List pages / watch events that did not fit the lean schemas (decoded generically):
    # a rise says the API server answers in a shape objects.py does not expect.
    core.metrics.add_counters("cfnet_kube_decode", "Kubernetes objects decoded "
                              "generically (shape outside the lean schema)", "what",
                              lambda: dict(objects.STATS))
    elector = kube.elector
    core.metrics.set_leader(elector.is_leader)
    ready = core.metrics.readiness
    ready.add("broker", broker_check(core, elector.is_leader))
    ready.add("kubernetes-caches", lambda: None if kube.actuator.wait_synced(0)
              else "pod and node caches not synced yet")
    ready.add("kubernetes-api", api_check(elector, a.lease_duration))
    log.info("placing through the Kubernetes API as %s (lease %s/%s)",
             a.identity, a.lease_namespace, a.lease_name)
    return kube


def start_enroll(a: argparse.Namespace, client: KubeClient, core: CoreService,
                 elector: LeaderElector) -> EnrollLoop | None:
    """``--agent-ca-secret``: the leader approves and signs the agents' CSRs; None, said in
    the log, when the flags or the CA cannot be used."""
    from cloud_core.k8s.enroll import (
        AgentEnroller,
        EnrollError,
        EnrollLoop,
        agent_user,
        ca_from_secret,
    )

    ca_ns, _, ca_name = a.agent_ca_secret.partition("/")
    try:
        if not ca_ns or not ca_name:
            raise EnrollError(f"--agent-ca-secret {a.agent_ca_secret!r}: expected "
                              "NAMESPACE/NAME")
        enroller = AgentEnroller(
            client, lambda: ca_from_secret(client, ca_ns, ca_name, days=a.agent_cert_days),
            agent_user=agent_user(a.agent_service_account
                                  or f"{a.lease_namespace}:cfnet-agent"),
            instance=a.identity)
    except CoreError as exc:
        log.error("%s", exc)
        return None
    enroll = EnrollLoop(enroller, elector.is_leader).start()
    core.metrics.add_counters("cfnet_agent_enrollment", "Agent CSRs handled by the "
                              "leader (signer cfnet.io/agent)", "outcome",
                              enroller.stats.as_dict)
    core.metrics.add_counters("cfnet_agent_enrollment_denied", "Agent CSRs denied, "
                              "by reason", "reason",
                              lambda: dict(enroller.stats.denied_by_reason))
    log.info("enrolling agents: CSRs of %s for signer cfnet.io/agent, CA %s",
             enroller.agent_user, a.agent_ca_secret)
    return enroll


def serve(a: argparse.Namespace, core: CoreService, kube: KubeRunner | None,
          stop: threading.Event, say: Callable[..., None]) -> None:
    """Until ``stop``: the node and link tables every ``--table-every`` seconds, and with
    ``--json-lines`` a stats line every ``--stats-every``."""
    from cloud_core.view import render_links, render_nodes

    every = [x for x in (a.table_every, a.stats_every if kube is not None else 0) if x > 0]
    next_table = time.monotonic() + a.table_every
    while not stop.wait(min(every) if every else 3600):
        if kube is not None and a.json_lines and a.stats_every > 0:
            st = kube.actuator.stats
            say("stats", bound=st.bound, conflicts=st.conflicts, failed=st.failed_scheduling)
        if a.table_every <= 0 or time.monotonic() < next_table - 0.01:
            continue
        next_table = time.monotonic() + a.table_every
        snap = core.state.snapshot(time.time())
        c = core.ingest.counters()
        log.info("ingest: %d accepted, %d duplicate, %d rejected %s\n%s\n\n%s",
                 c.accepted, c.duplicates, c.rejected_total, c.rejected or "",
                 render_nodes(snap), render_links(snap))


if __name__ == "__main__":
    sys.exit(main())
