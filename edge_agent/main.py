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
    from edge_agent.active import EchoServer
    from edge_agent.agent import Agent
    from edge_agent.bpf_loader import Pending
    from edge_agent.buffer import ReportBuffer
    from edge_agent.health import HealthServer
    from edge_agent.host import HostSampler
    from edge_agent.probes import LinkProbe
    from edge_agent.wire.mqtt import MqttClient, MqttSettings

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
                               probe_port=cfg.probe_port, bcc_fallback=cfg.bcc_fallback)
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
    from edge_agent.buffer import ReportBuffer
    from edge_agent.host import HostSampler, local_addresses
    from edge_agent.probes import ProbeConfig, open_probe

    boot = uuid.uuid4().hex[:16]
    addrs = local_addresses()
    buffer = ReportBuffer(
        cfg.buffer_path, max_bytes=cfg.buffer_max_bytes, max_age_s=cfg.buffer_max_age_s
    )
    host = HostSampler()
    if host.gpus.reason:
        log.info("%s", host.gpus.reason)
    agent_ref: list[Agent] = []
    mqtt = _connect(cfg, boot, agent_ref)
    try:
        probe, reason = open_probe(
            ProbeConfig(ebpf=cfg.ebpf, include_loopback=cfg.include_loopback, local_addrs=addrs,
                        probe_port=cfg.probe_port, bcc_fallback=cfg.bcc_fallback),
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
    running = _Running(cfg, boot, mqtt, probe, host, buffer)
    agent = running.start_agent(agent_ref, reason)
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
    running.close()
    return 0


def _connect(cfg: AgentConfig, boot: str, agent_ref: list[Agent]) -> MqttClient:
    """The broker connection, started: connecting while the eBPF load runs takes the TLS
    handshake off the path to the first report. Nothing is announced until the agent
    exists (``agent_ref`` holds it then)."""
    from edge_agent.agent import offline_status
    from edge_agent.wire import status_topic
    from edge_agent.wire.mqtt import MqttClient, Will

    mqtt = MqttClient(
        mqtt_settings(cfg),
        will=Will(status_topic(cfg.node), offline_status(cfg.node, boot)),
        on_connect=lambda: agent_ref[0].announce() if agent_ref else None,
        on_message=lambda m: agent_ref[0].on_message(m) if agent_ref else None,
    )
    mqtt.start()
    return mqtt


class _Running:
    """The agent's parts once the probe is open: started in order, closed in order."""

    def __init__(self, cfg: AgentConfig, boot: str, mqtt: MqttClient, probe: LinkProbe,
                 host: HostSampler, buffer: ReportBuffer) -> None:
        self.cfg, self.boot, self.mqtt = cfg, boot, mqtt
        self.probe, self.host, self.buffer = probe, host, buffer
        self.echo: EchoServer | None = None
        self.metrics: HealthServer | None = None

    def start_agent(self, agent_ref: list[Agent], fallback: str | None) -> Agent:
        """The echo server and the active prober (if on), the agent, its metrics port
        (``fallback``: why the probe is not the one configured, for ``/status``)."""
        from edge_agent.active import ActiveProber, EchoServer
        from edge_agent.agent import Agent

        cfg = self.cfg
        prober: ActiveProber | None = None
        if cfg.active_probing:
            self.echo = EchoServer(cfg.probe_bind, cfg.probe_port)
            self.echo.start()
            prober = ActiveProber(cfg.probe_port)
        agent = Agent(
            node=cfg.node,
            interval_s=cfg.interval_s,
            probe=self.probe,
            host=self.host,
            mqtt=self.mqtt,
            buffer=self.buffer,
            labels=cfg.labels,
            boot=self.boot,
            active_probe=prober.start if prober else None,
            peers=cfg.peers,
        )
        agent_ref.append(agent)
        if self.mqtt.connected:
            # Connected before the agent existed: on_connect skipped the announce.
            # (If it connected just now, on_connect announces as well; the retained
            # status is the same, so twice is harmless.)
            agent.announce()
        if cfg.metrics_port:
            from edge_agent.health import serve

            self.metrics = serve(agent, cfg.metrics_port, fallback=fallback)
            log.info("/healthz, /readyz, /status and /metrics on :%d", cfg.metrics_port)
        agent.start()
        return agent

    def close(self) -> None:
        """After the agent stopped: the offline status, then every part."""
        from edge_agent.agent import offline_status
        from edge_agent.wire import status_topic

        node, mqtt = self.cfg.node, self.mqtt
        if mqtt.connected:
            # A clean stop says so itself; the will is only for crashes.
            mqtt.publish(status_topic(node), offline_status(node, self.boot), retain=True).wait(2)
        mqtt.stop()
        if self.echo is not None:
            self.echo.stop()
        if self.metrics is not None:
            self.metrics.stop()
        self.probe.close()
        self.host.close()
        self.buffer.close()


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
