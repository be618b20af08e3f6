"""A real, locked-down Mosquitto for tests and the demo, run from a work directory.

:class:`Broker` writes a config from the same settings as
``deploy/mosquitto/mosquitto.conf`` (TLS, no anonymous access, a password file
and an ACL rendered by :mod:`tools.certs`, persistence), starts
``/usr/sbin/mosquitto`` on 127.0.0.1 only, waits until it accepts, and stops it
again. Accounts can be added before or after start: a running broker is sent
SIGHUP and the harness waits until the new credentials are accepted, so the
password file and the ACL (reloaded together) are both live when
``add_account`` returns. Readiness is probed with a hand-written MQTT 3.1.1
CONNECT over the standard library's ``ssl``, so the harness needs no MQTT client.

``tls=False`` opens a plain-TCP listener instead (still password + ACL); it is
for tests that need one, never for the demo or production.

As in production, ``use_username_as_clientid`` is on by default: the broker
uses the username as the client id, whatever the client sent. So one account
has at most one live connection (a second connection with the same username
takes the session over and disconnects the first): give every process its own
account (``core-1``, ``core-2``, ...). ``username_as_clientid=False`` turns it off
for a test that needs several connections of one account.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import ssl
import subprocess
import time
import weakref
from pathlib import Path
from types import TracebackType

from edge_agent.wire import MAX_PAYLOAD_BYTES
from tools.accounts import BusAccounts
from tools.certs import CertStore, Credentials, Role, render_agent_acl
from tools.netns import in_netns
from tools.publisher import utf8_field, varint

__all__ = ["Broker", "BrokerError", "Credentials", "Role", "free_port"]

MOSQUITTO = "/usr/sbin/mosquitto"
# Room for the topic, properties and fixed header on top of the largest payload
# the wire contract accepts; anything larger is cut off by the broker.
MAX_PACKET_SIZE = MAX_PAYLOAD_BYTES + 16 * 1024
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
RELOAD_TIMEOUT_S = 10.0


class BrokerError(RuntimeError):
    """The broker could not be started, reloaded or stopped."""


# Listening ports for test servers come from below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768-60999 by default). A port the kernel hands out
# for bind(0) lies inside that range, and between our close() and the server's
# bind() any outgoing connection of a parallel test may take it as its source port.
_LISTEN_PORTS = range(20000, 32768)
_picked: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, outside the ephemeral range and not
    handed out before by this process (the caller still retries on a race)."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(_LISTEN_PORTS)
        if port in _picked:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _picked.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded range
        s.bind((host, 0))
        return int(s.getsockname()[1])


def mqtt_connect_probe(
    host: str,
    port: int,
    *,
    username: str | None,
    password: str | None,
    ca_file: Path | None,
    timeout_s: float = 3.0,
    client_id: str | None = None,
) -> int:
    """CONNECT once with MQTT 3.1.1 and return the CONNACK return code (0 = accepted).
    ``client_id``: the ID to send (default: a fresh ``cfnet-probe-...``).

    Raises OSError (ssl.SSLError included) when no CONNACK comes back.
    """
    flags = 0x02  # clean session
    payload = utf8_field(client_id if client_id is not None
                         else f"cfnet-probe-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    if username is not None:
        flags |= 0x80
        payload += utf8_field(username)
        if password is not None:
            flags |= 0x40
            payload += utf8_field(password)
    variable = utf8_field("MQTT") + bytes([4, flags]) + (10).to_bytes(2, "big")
    body = variable + payload
    packet = bytes([0x10]) + varint(len(body)) + body
    raw = socket.create_connection((host, port), timeout=timeout_s)
    sock: socket.socket = raw
    try:
        if ca_file is not None:
            ctx = ssl.create_default_context(cafile=str(ca_file))
            sock = ctx.wrap_socket(raw, server_hostname=host)
        sock.sendall(packet)
        connack = b""
        while len(connack) < 4:
            chunk = sock.recv(4 - len(connack))
            if not chunk:
                raise ConnectionResetError("broker closed the connection before CONNACK")
            connack += chunk
        if connack[0] != 0x20:
            raise ConnectionError(f"unexpected reply {connack!r}")
        with contextlib.suppress(OSError):
            sock.sendall(b"\xe0\x00")  # DISCONNECT
        return connack[3]
    finally:
        sock.close()


class Broker(BusAccounts):
    """A Mosquitto process with TLS, password auth and the cfnet ACL. Context manager."""

    _error = BrokerError

    def __init__(
        self,
        workdir: Path,
        *,
        tls: bool = True,
        port: int = 0,
        persistence: bool = True,
        username_as_clientid: bool = True,
        extra_conf: str = "",
        host: str = "127.0.0.1",
        netns: str | None = None,
        agent_ca: Path | None = None,
    ) -> None:
        """``netns``/``host``: run inside that network namespace, listening on ``host``
        (the demo and end-to-end tests put the broker in the lab's cloud site).

        ``agent_ca`` (a CA certificate file): also open the agents' certificate listener on
        ``cert_port``, as deploy/mosquitto/mosquitto.conf does: a client certificate of that
        CA is required, its CN is the username, and the ACL is the ``%u`` patterns of
        ``tools.certs.render_agent_acl``. Listener settings are then per listener."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.netns = netns
        self.tls = tls
        self.persistence = persistence
        self.username_as_clientid = username_as_clientid
        self.extra_conf = extra_conf
        self._auto_port = port == 0
        self.port = port or in_netns(netns, free_port, self.host)
        self.agent_ca = Path(agent_ca) if agent_ca is not None else None
        self.cert_port = in_netns(netns, free_port, self.host) if agent_ca is not None else 0
        self.store = CertStore(self.workdir / "pki")
        self.store.init([f"IP:{host}"] if host not in ("127.0.0.1", "localhost") else [])
        self.conf_file = self.workdir / "mosquitto.conf"
        self.log_file = self.workdir / "mosquitto.log"
        self.data_dir = self.workdir / "data"
        self._proc: subprocess.Popen[bytes] | None = None
        self._ever_started = False
        # A test that dies without stop() must not leave a broker behind.
        self._finalizer = weakref.finalize(self, _terminate, None)

    # ------------------------------------------------------------------ properties
    @property
    def ca_file(self) -> Path:
        return self.store.ca_file

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc else None

    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    # ------------------------------------------------------------------ config
    def render_conf(self) -> str:
        """The config file this broker runs with."""
        per_listener = self.agent_ca is not None
        security = [
            "allow_anonymous false",
            f"password_file {self.store.password_file}",
            f"acl_file {self.store.acl_file}",
        ]
        lines = [
            "# Generated by tools/broker.py for tests and the demo; production uses",
            "# deploy/mosquitto/mosquitto.conf. Same security settings.",
            f"per_listener_settings {str(per_listener).lower()}",
            *([] if per_listener else security),
            # Running as root in CI: keep root rather than drop to 'mosquitto',
            # which could not read the 0600 files in a root-owned temp dir.
            *(["user root"] if os.geteuid() == 0 else []),
            f"max_packet_size {MAX_PACKET_SIZE}",
            "max_inflight_messages 100",
            "max_queued_messages 10000",
            "persistent_client_expiration 1d",
            "max_keepalive 300",
            "set_tcp_nodelay true",
            f"log_dest file {self.log_file}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "connection_messages true",
            "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        ]
        if self.persistence:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            lines += [
                "persistence true",
                f"persistence_location {self.data_dir}/",  # must end in /
                "autosave_interval 5",
            ]
        else:
            lines.append("persistence false")
        lines.append(f"listener {self.port} {self.host}")
        if per_listener:
            lines += security
        # A listener option: before any 'listener' line it would configure (and
        # open!) a default listener on 1883. As in production: the broker
        # replaces every client id with the username, so no account can take
        # over another's session (one account = one live connection).
        lines.append(f"use_username_as_clientid {str(self.username_as_clientid).lower()}")
        if self.tls:
            lines += [
                f"cafile {self.store.ca_file}",
                f"certfile {self.store.broker_cert}",
                f"keyfile {self.store.broker_key}",
                "tls_version tlsv1.2",
                "require_certificate false",
            ]
        if self.extra_conf:
            # After the listener line: listener options here apply to it.
            lines.append(self.extra_conf)
        if self.agent_ca is not None:
            agent_acl = self.workdir / "agent-acl"
            agent_acl.write_text(render_agent_acl())
            lines += [
                f"listener {self.cert_port} {self.host}",
                "allow_anonymous false",
                f"acl_file {agent_acl}",
                f"use_username_as_clientid {str(self.username_as_clientid).lower()}",
                f"cafile {self.agent_ca}",
                f"certfile {self.store.broker_cert}",
                f"keyfile {self.store.broker_key}",
                "tls_version tlsv1.2",
                "require_certificate true",
                "use_identity_as_username true",
            ]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start Mosquitto and wait until its listener completes a handshake."""
        if self.running:
            return
        # A port we picked may be taken before Mosquitto binds it: pick again,
        # but only before the first successful start (restart keeps the port).
        attempts = 3 if self._auto_port and not self._ever_started else 1
        for attempt in range(attempts):
            try:
                self._start_once()
                self._ever_started = True
                return
            except BrokerError:
                if attempt + 1 == attempts or "Address already in use" not in self._log_tail():
                    raise
                self.port = in_netns(self.netns, free_port, self.host)

    def _start_once(self) -> None:
        self.conf_file.write_text(self.render_conf())
        out = open(self.workdir / "mosquitto.out", "ab")  # noqa: SIM115 - handed to Popen
        try:
            self._proc = subprocess.Popen(
                [*self._ns_prefix(), MOSQUITTO, "-c", str(self.conf_file)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise BrokerError(f"cannot run {MOSQUITTO}: {exc}") from exc
        finally:
            out.close()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _terminate, self._proc)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerError(
                    f"mosquitto exited with {self._proc.returncode}: {self._log_tail()}"
                )
            if self._listener_ready():
                return
            time.sleep(0.05)
        self.kill()
        raise BrokerError(f"mosquitto did not accept within {START_TIMEOUT_S}s: {self._log_tail()}")

    def _ns_prefix(self) -> list[str]:
        # `ip netns exec` execs Mosquitto in place, so our pid is Mosquitto's.
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def _listener_ready(self) -> bool:
        return in_netns(self.netns, self._listener_ready_here)

    def _listener_ready_here(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0) as raw:
                if self.tls:
                    ctx = ssl.create_default_context(cafile=str(self.ca_file))
                    with ctx.wrap_socket(raw, server_hostname=self.host):
                        pass
            return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM and wait (Mosquitto saves its persistence file on the way out)."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        self._proc = None
        self._finalizer.detach()

    def kill(self) -> None:
        """SIGKILL: a crash. What was not autosaved (every 5 s here) is lost."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)
        self._proc = None
        self._finalizer.detach()

    def restart(self) -> None:
        """Stop and start again on the same port with the same persistence directory.

        ``stop()`` ... ``start()`` does the same with a gap (a broker outage).
        """
        self.stop()
        self.start()

    def reload(self) -> None:
        """SIGHUP: Mosquitto re-reads the password file and the ACL."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGHUP)

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ accounts
    # add_account, remove_account, credentials: tools.accounts.BusAccounts.
    def _reload_accounts(self) -> None:
        self.reload()

    def _wait_account(self, creds: Credentials, *, accepted: bool) -> None:
        if accepted:
            self._wait_accepts(creds)
            return
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        while self.probe(creds.username, creds.password) == 0:
            if time.monotonic() > deadline:
                raise BrokerError(f"{creds.username!r} still accepted after reload")
            time.sleep(0.05)

    def _wait_accepts(self, creds: Credentials) -> None:
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = self.probe(creds.username, creds.password)
                if last == 0:
                    return
            except OSError as exc:
                last = exc
            time.sleep(0.05)
        raise BrokerError(f"{creds.username!r} not accepted after reload: {last}")

    def probe(self, username: str | None, password: str | None) -> int:
        """CONNECT with these credentials; the MQTT 3.1.1 CONNACK code (0 accepted, 5 refused).

        With ``username_as_clientid`` (the default) this kicks a client that is
        connected with the same username off the broker, as any second
        connection of one account does.
        """
        return in_netns(
            self.netns,
            mqtt_connect_probe,
            self.host,
            self.port,
            username=username,
            password=password,
            ca_file=self.ca_file if self.tls else None,
        )

    # ------------------------------------------------------------------ diagnostics
    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def _log_tail(self, n: int = 20) -> str:
        text = self.log_text()
        with contextlib.suppress(OSError):
            text += (self.workdir / "mosquitto.out").read_text(errors="replace")
        return " | ".join(text.strip().splitlines()[-n:])


def _terminate(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT_S)
