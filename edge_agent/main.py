"""`cfnet-agent`: wires configuration, probes, host sampler, buffer and MQTT, and runs.

Start-up order is for the time to the first report: the eBPF load is started
right after the configuration is read, before the heavier imports (paho, psutil,
SQLite), and runs beside them and the buffer, host sampler and broker connect: the
CO-RE load in a thread (libbpf and the verifier run without the GIL), the BCC
fallback's compile in its loader process. The probe claims the descriptors when it
is constructed. So this module imports only the light modules at its top.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import uuid
from typing import TYPE_CHECKING

from edge_agent.config import AgentConfig, load_config
from edge_agent.errors import AgentError
from edge_agent.wire.logsetup import configure_logging

if TYPE_CHECKING:
    from edge_agent.bpf_loader import Pending
    from edge_agent.wire.mqtt import MqttSettings

log = logging.getLogger("cfnet.agent")


def start_loader_early(cfg: AgentConfig) -> Pending | None:
    """Start the eBPF load now if the configuration wants eBPF (None if not, or if it
    can't start: the probe then runs its own checks and says why it falls back)."""
    if not cfg.ebpf:
        return None
    from edge_agent.probes.ebpf import start_early

    # The probe filters on the node's addresses, which a node nearly always has;
    # if it has none the probe sees another request and loads again.
    pending, why = start_early(include_loopback=cfg.include_loopback, filter_local=True,
                               probe_port=cfg.probe_port)
    if pending is None:
        log.debug("eBPF loader not started early: %s", why)
    return pending


def read_config(argv: list[str] | None) -> AgentConfig:
    """The configuration (:func:`edge_agent.config.load_config`); then what only parsing
    the command line needed (argparse) is dropped before the heavy imports, which reuse its
    memory (:func:`edge_agent.lightimport.forget`)."""
    from edge_agent.config import PARSE_ONLY_MODULES
    from edge_agent.lightimport import forget

    try:
        return load_config(argv)
    finally:
        forget(PARSE_ONLY_MODULES)


def mqtt_settings(cfg: AgentConfig) -> MqttSettings:
    from edge_agent.wire.mqtt import MqttSettings, protocol_for_bus

    failover = tuple((a.rpartition(":")[0].strip("[]"), int(a.rpartition(":")[2]))
                     for a in cfg.broker_failover)
    return MqttSettings(
        host=cfg.broker_host,
        port=cfg.broker_port,
        username=cfg.username,
        password=cfg.resolved_password(),
        tls=cfg.tls,
        ca_file=cfg.ca_file,
        certfile=cfg.certfile,
        keyfile=cfg.keyfile,
        client_id=f"agent-{cfg.node}",
        keepalive_s=cfg.keepalive_s,
        protocol=protocol_for_bus(cfg.bus),
        failover=failover,
    )


def run(cfg: AgentConfig, stop: threading.Event, early: Pending | None = None) -> int:
    """Run the agent until ``stop``; ``early``: a loader started by :func:`start_loader_early`."""
    try:
        return _run(cfg, stop, early)
    finally:
        if early is not None:
            early.cancel()  # a no-op once the probe claimed it


def _run(cfg: AgentConfig, stop: threading.Event, early: Pending | None) -> int:
    from edge_agent.active import ActiveProber, EchoServer
    from edge_agent.agent import Agent, offline_status
    from edge_agent.buffer import ReportBuffer
    from edge_agent.host import HostSampler, local_addresses
    from edge_agent.probes import ProbeConfig, open_probe
    from edge_agent.wire import status_topic
    from edge_agent.wire.mqtt import MqttClient, Will

    boot = uuid.uuid4().hex[:16]
    addrs = local_addresses()
    buffer = ReportBuffer(
        cfg.buffer_path, max_bytes=cfg.buffer_max_bytes, max_age_s=cfg.buffer_max_age_s
    )
    host = HostSampler()
    if host.gpus.reason:
        log.info("%s", host.gpus.reason)
    agent_ref: list[Agent] = []
    mqtt = MqttClient(
        mqtt_settings(cfg),
        will=Will(status_topic(cfg.node), offline_status(cfg.node, boot)),
        on_connect=lambda: agent_ref[0].announce() if agent_ref else None,
        on_message=lambda m: agent_ref[0].on_message(m) if agent_ref else None,
    )
    # Connecting while the eBPF load runs: the TLS handshake is off the path
    # to the first report. Nothing is announced until the agent exists (below).
    mqtt.start()
    try:
        probe, reason = open_probe(
            ProbeConfig(ebpf=cfg.ebpf, include_loopback=cfg.include_loopback, local_addrs=addrs,
                        probe_port=cfg.probe_port),
            pending=early,
        )
    except BaseException:
        mqtt.stop()
        host.close()
        buffer.close()
        raise
    log.info(
        "node %s boot %s: probe %s%s; addresses %s",
        cfg.node, boot, probe.name, f" (fallback: {reason})" if reason else "", ", ".join(addrs),
    )
    echo: EchoServer | None = None
    prober: ActiveProber | None = None
    if cfg.active_probing:
        echo = EchoServer(cfg.probe_bind, cfg.probe_port)
        echo.start()
        prober = ActiveProber(cfg.probe_port)
    agent = Agent(
        node=cfg.node,
        interval_s=cfg.interval_s,
        probe=probe,
        host=host,
        mqtt=mqtt,
        buffer=buffer,
        labels=cfg.labels,
        boot=boot,
        active_probe=prober.start if prober else None,
        peers=cfg.peers,
    )
    agent_ref.append(agent)
    if mqtt.connected:
        # Connected before the agent existed: on_connect skipped the announce.
        # (If it connected just now, on_connect announces as well; the retained
        # status is the same, so twice is harmless.)
        agent.announce()
    metrics = None
    if cfg.metrics_port:
        from edge_agent.metrics import serve_agent_metrics

        metrics = serve_agent_metrics(agent, cfg.metrics_port)
        log.info("metrics on :%d/metrics", cfg.metrics_port)
    agent.start()
    if cfg.identity == "certificate" and cfg.certfile is not None and cfg.keyfile is not None:
        from edge_agent.enroll import Renewer, enroll_settings

        Renewer(enroll_settings(cfg), mqtt.reload_client_cert, stop).start()
    if not mqtt.wait_connected(10):
        log.warning(
            "not connected to %s:%s yet (%s); buffering reports to %s",
            cfg.broker_host, cfg.broker_port, mqtt.last_refusal or "no answer", cfg.buffer_path,
        )
    stop.wait()
    log.info("stopping")
    agent.stop()
    # Counted after the sampler has stopped: read before, a report taken in between
    # was missing from the count (the buffer test caught it off by one).
    log.info("stopped: %d reports taken, %d published, %d acknowledged by the core, "
             "%d still buffered", agent.stats.reports, agent.stats.published,
             agent.stats.acked, buffer.depth())
    if mqtt.connected:
        # A clean stop says so itself; the will is only for crashes.
        mqtt.publish(status_topic(cfg.node), offline_status(cfg.node, boot), retain=True).wait(2)
    mqtt.stop()
    if echo is not None:
        echo.stop()
    if metrics is not None:
        metrics.shutdown()
    probe.close()
    host.close()
    buffer.close()
    return 0


M_ARENA_MAX = -8  # glibc's malloc.h


def one_malloc_arena() -> bool:
    """One glibc malloc arena for all the agent's threads; True if set.

    glibc gives each thread that allocates an arena of its own (up to 8 per core), and
    each keeps its freed memory: 0.2-0.3 MiB of the agent's resident memory for its
    threads (MQTT, sampler, echo server, the early load), which allocate little and rarely
    at once, so sharing the main arena costs no contention worth measuring. Set with
    ``mallopt`` before any thread starts; left alone where ``MALLOC_ARENA_MAX`` or a
    ``GLIBC_TUNABLES`` arena setting says otherwise, and where the C library is not glibc.
    """
    import os

    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_ARENA_MAX, 1))


def main(argv: list[str] | None = None) -> int:
    one_malloc_arena()  # first: before any thread
    configure_logging("text")
    try:
        cfg = read_config(argv)
    except AgentError as exc:
        print(f"cfnet-agent: {exc}", file=sys.stderr)
        return 2
    configure_logging(cfg.log_format)
    early = start_loader_early(cfg)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        if cfg.identity == "certificate":
            # Before connecting (the eBPF loader compiles meanwhile): the broker's
            # certificate listener takes the certificate's CN as the username.
            from edge_agent.enroll import enrolled

            try:
                cfg = enrolled(cfg, stop)
            except BaseException:
                if early is not None:
                    early.cancel()
                raise
        return run(cfg, stop, early)
    except AgentError as exc:
        log.error("%s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
