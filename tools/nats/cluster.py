"""A real 3-node NATS JetStream cluster with its MQTT listener, for tests and benchmarks.

:class:`NatsCluster` has the surface of :class:`tools.broker.Broker` that tests use
(``host``, ``port``, ``tls``, ``ca_file``, ``add_account``, ``credentials``,
``remove_account``, ``probe``, ``start``/``stop``, context manager), so an integration
test takes either through one ``bus`` fixture. On top it can kill and restart one node
(:meth:`kill_node`, :meth:`start_node`) and gives every node's MQTT address
(:attr:`addresses`) for clients' failover.

Each node: TLS on the MQTT listener with the same PKI as the Mosquitto harness
(:class:`tools.certs.CertStore`), JetStream with file storage, MQTT state (sessions,
retained messages, QoS 1 messages) replicated on all three nodes
(``stream_replicas: 3``), every account a NATS user whose permissions are the cfnet
ACL of :func:`tools.certs.acl_rules` translated to NATS subjects
(:func:`nats_permissions`). Agents and operators may connect over MQTT only
(``allowed_connection_types``): a native NATS connection could subscribe to the
server's internal ``$MQTT.sub.>`` deliveries, which MQTT clients cannot.
Adding or removing an account rewrites every node's config and reloads it (SIGHUP),
then waits until every node accepts (or refuses) the credentials.

``callout=True``: the accounts are admitted by the auth callout instead
(``cloud_core.bus_callout``, run beside the nodes; :func:`callout_accounts` renders what
it admits): each account only with its own MQTT client ID (docs/security.md, "Client IDs
on NATS"). The nodes' config then lists only the harness's users and the callout's.

Loopback only. Passwords are in the nodes' config files (0600, in a 0700 work
directory): a test harness. The chart renders bcrypt hashes instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cloud_core.bus_callout import account_public, new_account_seed
from cloud_core.bus_certs import NODE
from cloud_core.bus_nats import EDGE_STREAM, STREAM, subject_to_topic, topic_to_subject
from cloud_core.bus_retained import (
    MSG_GET,
    RETAINED_PREFIX,
    RETAINED_STREAM,
    stored_payload,
    topic_subject,
)
from edge_agent.wire.mqtt import wire_client_id
from tools.accounts import BusAccounts
from tools.broker import free_port, mqtt_connect_probe
from tools.certs import CertStore, Credentials, Role, acl_rules
from tools.netns import in_netns

__all__ = ["NatsCluster", "NatsError", "account_users", "build_nats", "callout_accounts",
           "callout_conf", "log_tail",
           "mqtt_to_subject", "nats_permissions", "render_accounts", "spawn_server",
           "stop_server", "subject_to_topic", "tls_block", "write_conf"]

BUILD_SCRIPT = Path(__file__).with_name("build.sh")
PORT_ATTEMPTS = 3  # starts with freshly picked ports when one was taken
START_TIMEOUT_S = 60.0
RELOAD_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
# The harness's own account, used to tell when a node's MQTT listener is ready.
READY_USER = "harness-ready"
# The harness's own native-NATS user with every permission (provisioning streams).
ADMIN_USER = "harness-admin"
# The auth callout's own native-NATS user (cloud_core/bus_callout.py): bypasses the callout.
CALLOUT_USER = "cfnet-callout"
# The callout's system-account user: cuts off revoked nodes' connections ($SYS KICK).
CALLOUT_SYS_USER = "cfnet-callout-sys"
SYS_ACCOUNT = "SYS"
# Room for the largest payload the wire accepts plus topic and envelope.
MAX_PAYLOAD = 256 * 1024 + 16 * 1024


class NatsError(RuntimeError):
    """The cluster could not be built, started, reloaded or stopped."""


def build_nats() -> Path:
    """Build nats-server from the Go module proxy when missing (cached, locked); its path.

    Progress goes to the real stderr, so pytest's capture does not hide a cold build
    (about 6 minutes on a loaded 2-core machine).
    """
    r = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-path"], capture_output=True,
                       text=True, check=False)
    path = Path(r.stdout.strip())
    if r.returncode == 0 and os.access(path, os.X_OK):
        return path
    out = sys.__stderr__
    print(f"[nats] building nats-server into {path.parent} (first run only)", file=out,
          flush=True)
    proc = subprocess.Popen(["nice", "-n", "10", "bash", str(BUILD_SCRIPT)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None and proc.stdout is not None
    tail: list[str] = []
    for line in proc.stderr:
        print(line.rstrip(), file=out, flush=True)
        tail = [*tail[-40:], line]
    printed = proc.stdout.read().strip()
    if proc.wait() != 0 or not printed or not os.access(printed.splitlines()[-1], os.X_OK):
        raise NatsError(f"building nats-server failed ({BUILD_SCRIPT}):\n" + "".join(tail))
    return Path(printed.splitlines()[-1])


def mqtt_to_subject(topic: str) -> str:
    """An MQTT topic or filter as the NATS subject its MQTT listener maps it to
    (:func:`cloud_core.bus_nats.topic_to_subject`). cfnet topics never have empty
    levels, so the listener's escapes for those are not needed: refused here."""
    if any(lv == "" for lv in topic.split("/")):
        raise NatsError(f"topic {topic!r} has an empty level")
    return topic_to_subject(topic)


def nats_permissions(name: str, role: Role) -> dict[str, object]:
    """The cfnet ACL for one account as NATS publish/subscribe allow lists."""
    pub: list[str] = []
    sub: list[str] = ["$MQTT.sub.>"]  # where the server delivers QoS 1 messages to MQTT
    for access, topic in acl_rules(name, role):
        if topic.startswith("$share/"):
            continue  # no $share on NATS: queue groups do that job
        subject = mqtt_to_subject(topic)
        if "write" in access:
            pub.append(subject)
        if "read" in access:
            sub.append(subject)
    if role == "core":
        # Shared ingest over native NATS (cloud_core/bus_nats_ingest.py): its stream, its
        # consumers, fetching and acking, replies on the core's own inbox prefix.
        api = "$JS.API"
        pub += [f"{api}.INFO", f"{api}.STREAM.INFO.{STREAM}", f"{api}.STREAM.CREATE.{STREAM}",
                # Re-arming an edge site's stalled source (bus_nats_sites.SourceResumer): the
                # stream's config, and whether the site's JetStream domain answers.
                f"{api}.STREAM.UPDATE.{STREAM}", "$JS.*.API.INFO",
                # Linking the edge sites it is configured with (--nats-sites): the site's
                # CFNET_EDGE on its leaf, through the site's domain; that stream only.
                # Any domain: a site is added without re-rendering this file.
                f"$JS.*.API.STREAM.INFO.{EDGE_STREAM}", f"$JS.*.API.STREAM.CREATE.{EDGE_STREAM}",
                f"{api}.CONSUMER.*.{STREAM}.>", f"{api}.CONSUMER.DURABLE.CREATE.{STREAM}.>",
                f"{api}.CONSUMER.MSG.NEXT.{STREAM}.>", f"$JS.ACK.{STREAM}.>",
                # The console's retained-request check (cloud_core/bus_retained.py): read
                # the bus's retained store, delete a retained request's stored copy.
                f"{api}.STREAM.MSG.GET.{RETAINED_STREAM}",
                f"{api}.STREAM.MSG.DELETE.{RETAINED_STREAM}"]
        sub.append(f"_INBOX_{name}.>")
    return {"publish": {"allow": pub or ["_cfnet_nothing"]},
            "subscribe": {"allow": sub}}


def _conn_types(role: Role) -> list[str]:
    # Cores may also speak native NATS (queue-group ingest); nobody else.
    return ["MQTT", "STANDARD"] if role == "core" else ["MQTT"]


# ---------------------------------------------------------------------- shared by every
# nats-server this package runs (the hub's nodes here, an edge site's leaf in leaf.py).
def tls_block(store: CertStore) -> str:
    """The ``tls { ... }`` block: the store's server certificate, key and CA."""
    return (f'tls {{ cert_file: "{store.broker_cert}", key_file: "{store.broker_key}", '
            f'ca_file: "{store.ca_file}", timeout: 5 }}')


def account_users(store: CertStore) -> list[dict[str, object]]:
    """Every account of the store as a NATS user with its cfnet ACL."""
    return [{"user": name, "password": store.credentials(name).password,
             "permissions": nats_permissions(name, role),
             "allowed_connection_types": _conn_types(role)}
            for name, role in sorted(store.accounts().items())]


def own_client_ids(name: str, role: Role) -> set[str]:
    """The MQTT client IDs that are this account's own session: its name (what cores,
    simulators and Mosquitto's ``use_username_as_clientid`` use) and, for an agent, the
    ``agent-<node>`` the edge agent sends; as sent on the 3.1.1 wire (no ``.``)."""
    ids = {wire_client_id(name, "mqtt311")}
    if role == "agent":
        ids.add(wire_client_id(f"agent-{name}", "mqtt311"))
    return ids


def callout_accounts(store: CertStore, revoked: Iterable[str] = ()) -> dict[str, object]:
    """What the auth callout (``cloud_core.bus_callout``) admits: every account of the
    store with its password, its own client IDs, its NATS permissions (JWT form) and
    connection types. An ID two accounts could both claim (node ``b``'s ``agent-b`` and an
    account named ``agent-b``) is nobody's: refused to both rather than shared."""
    accounts = sorted(store.accounts().items())
    owners: dict[str, set[str]] = {}
    for name, role in accounts:
        for cid in own_client_ids(name, role):
            owners.setdefault(cid, set()).add(name)
    users: dict[str, object] = {}
    for name, role in accounts:
        perms = nats_permissions(name, role)
        users[name] = {
            "password": store.credentials(name).password,
            "client_ids": sorted(c for c in own_client_ids(name, role) if owners[c] == {name}),
            # cfnetctl connects with an empty ID and a clean session; the server names it.
            "server_assigned": role == "operator",
            "permissions": {"pub": perms["publish"], "sub": perms["subscribe"]},
            "allowed_connection_types": _conn_types(role)}
    return {"version": 1, "users": users, "cert_agents": cert_agents(revoked)}


def cert_agents(revoked: Iterable[str] = ()) -> dict[str, object]:
    """What the callout admits an enrolled agent with, by its client certificate
    (``cloud_core.bus_certs``): the agent role's permissions and client IDs with
    :data:`~cloud_core.bus_certs.NODE` for the node, and the revoked nodes."""
    perms = nats_permissions(NODE, "agent")
    return {"permissions": {"pub": perms["publish"], "sub": perms["subscribe"]},
            "client_ids": sorted(own_client_ids(NODE, "agent")),
            "allowed_connection_types": _conn_types("agent"),
            "revoked": sorted(set(revoked))}


def callout_conf(issuer: str, auth_users: list[str]) -> str:
    """The ``auth_callout`` block (inside ``authorization``): every user but ``auth_users``
    is admitted by the callout signing with the account key ``issuer``."""
    return f"auth_callout {{ issuer: {json.dumps(issuer)}, auth_users: {json.dumps(auth_users)} }}"


def callout_user(password: str) -> dict[str, object]:
    """The callout service's NATS user: native only, receives requests, answers them."""
    return {"user": CALLOUT_USER, "password": password,
            "permissions": {"publish": {"allow": ["$SYS._INBOX.>"]},
                            "subscribe": {"allow": ["$SYS.REQ.USER.AUTH", "_INBOX.>"]}},
            "allowed_connection_types": ["STANDARD"]}


def write_conf(path: Path, text: str) -> None:
    """A server config holds passwords: 0600 before anything is written."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)


def spawn_server(binary: Path, conf: Path, log: Path,
                 netns: str | None) -> subprocess.Popen[bytes]:
    """``nats-server -c conf``, output appended to ``log``, in ``netns`` if given (``ip
    netns exec`` execs the server in place: the pid is nats-server's)."""
    out = open(log, "ab")  # noqa: SIM115 - handed to Popen
    try:
        prefix = ["ip", "netns", "exec", netns] if netns else []
        return subprocess.Popen([*prefix, str(binary), "-c", str(conf)],
                                stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise NatsError(f"cannot run {binary}: {exc}") from exc
    finally:
        out.close()


def stop_server(p: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL if it has not exited within :data:`STOP_TIMEOUT_S`."""
    if p.poll() is None:
        p.terminate()
    try:
        p.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=STOP_TIMEOUT_S)


def log_tail(log: Path, lines: int = 15) -> str:
    """The last lines of a server's log on one line (for error messages)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


@dataclass
class _Node:
    name: str
    mqtt_port: int
    client_port: int
    cluster_port: int
    conf: Path
    store_dir: Path
    log: Path
    leaf_port: int = 0  # the leafnode listener, where edge sites connect (0: none)
    proc: subprocess.Popen[bytes] | None = None


class NatsCluster(BusAccounts):
    """Three nats-server processes clustered on loopback. Context manager."""

    _error = NatsError

    def __init__(self, workdir: Path, *, size: int = 3, binary: Path | None = None,
                 tls: bool = True, host: str = "127.0.0.1", netns: str | None = None,
                 leafnodes: bool = False, extra_sans: tuple[str, ...] = (),
                 callout: bool = False, callout_ttl_s: int = 0,
                 agent_ca: Path | None = None) -> None:
        """``netns``/``host``: run every node inside that network namespace, listening on
        ``host`` (the lab's cloud site); ``leafnodes``: each node also listens for edge
        sites' leaf nodes (:class:`tools.nats.leaf.EdgeLeaf`, user :attr:`leaf_user`);
        ``extra_sans``: more names for the servers' certificate (``IP:...`` of an edge
        site's leaf node, which serves the same certificate to its agents); ``callout``:
        accounts are admitted by the auth callout (``cloud_core.bus_callout``, one process
        beside the nodes), which holds every account to its own MQTT client ID;
        ``callout_ttl_s``: its ``--user-ttl``; ``agent_ca`` (with ``callout``): the MQTT
        listener verifies a client certificate when one is presented (``verify:
        "optional"``, this CA file), and the callout admits an enrolled agent by it
        (``cloud_core.bus_certs``), cutting off a revoked node's connections
        (:meth:`revoke`) through a system-account user."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o700)
        self.host = host
        self.netns = netns
        self.tls = tls
        self.binary = binary
        self.store = CertStore(self.workdir / "pki")
        self.store.init([*([f"IP:{host}"] if host not in ("127.0.0.1", "localhost") else []),
                         *extra_sans])
        self._ready_password = os.urandom(12).hex()
        self.leaf_password = os.urandom(12).hex()
        # The harness's native-NATS user (JetStream provisioning: an edge site's source).
        self.admin_password = os.urandom(12).hex()
        self.callout = callout
        self.callout_ttl_s = callout_ttl_s
        self.callout_password = os.urandom(12).hex()
        if agent_ca is not None and not callout:
            raise NatsError("agent certificates on NATS are admitted by the auth callout")
        self.agent_ca = agent_ca
        self.revoked: set[str] = set()
        self.callout_sys_password = os.urandom(12).hex()
        self._callout_seed = new_account_seed()
        self.callout_log = self.workdir / "callout.log"
        self._callout_proc: subprocess.Popen[bytes] | None = None

        self.nodes = [
            _Node(f"n{i}", 0, 0, 0, self.workdir / f"n{i}.conf",
                  self.workdir / f"n{i}" / "js", self.workdir / f"n{i}.log")
            for i in range(size)
        ]
        self._leafnodes = leafnodes
        self._pick_ports()
        self._finalizer = weakref.finalize(self, _terminate_all, [])

    def _pick_ports(self) -> None:
        def port() -> int:
            return in_netns(self.netns, free_port, self.host)

        for n in self.nodes:
            n.mqtt_port, n.client_port, n.cluster_port = port(), port(), port()
            n.leaf_port = port() if self._leafnodes else 0

    # ------------------------------------------------------------------ properties
    @property
    def port(self) -> int:
        """MQTT port of the first node (clients also get :attr:`failover`)."""
        return self.nodes[0].mqtt_port

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        return tuple((self.host, n.mqtt_port) for n in self.nodes)

    @property
    def failover(self) -> tuple[tuple[str, int], ...]:
        """Every node's MQTT address but the first: ``MqttSettings.failover``."""
        return self.addresses[1:]

    @property
    def nats_urls(self) -> list[str]:
        scheme = "tls" if self.tls else "nats"
        return [f"{scheme}://{self.host}:{n.client_port}" for n in self.nodes]

    @property
    def ca_file(self) -> Path:
        return self.store.ca_file

    @property
    def running(self) -> bool:
        return any(n.proc is not None and n.proc.poll() is None for n in self.nodes)

    def pids(self) -> list[int]:
        return [n.proc.pid for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    leaf_user = "cfnet-leaf"

    @property
    def leaf_urls(self) -> list[str]:
        """Every node's leafnode listener (empty unless started with ``leafnodes``)."""
        return [f"nats-leaf://{self.host}:{n.leaf_port}" for n in self.nodes if n.leaf_port]

    # ------------------------------------------------------------------ config
    def render_conf(self, node: _Node) -> str:
        tls = tls_block(self.store) if self.tls else ""
        routes = ", ".join(f'"nats-route://{self.host}:{n.cluster_port}"'
                           for n in self.nodes if n is not node)
        users = [{"user": READY_USER, "password": self._ready_password,
                  "permissions": {"publish": {"deny": [">"]}, "subscribe": {"deny": [">"]}},
                  "allowed_connection_types": ["MQTT"]},
                 {"user": ADMIN_USER, "password": self.admin_password,
                  "allowed_connection_types": ["STANDARD"]},
                 *([callout_user(self.callout_password)] if self.callout
                   else account_users(self.store))]
        auth = f"users: {json.dumps(users)}"
        if self.callout:
            # Edge sites' leaf connections authenticate as the hub's leaf user (the leafnodes
            # block's own authorization); the callout would refuse them: not an account.
            bypass = [READY_USER, ADMIN_USER, CALLOUT_USER,
                      *([self.leaf_user] if node.leaf_port else []),
                      *([CALLOUT_SYS_USER] if self.agent_ca is not None else [])]
            auth += ", " + callout_conf(account_public(self._callout_seed), bypass)
        mqtt_tls = tls
        if self.tls and self.agent_ca is not None:
            # A certificate is verified when presented (agents), optional otherwise
            # (cores, operators: passwords); the callout names the agent by it.
            mqtt_tls = (f'tls {{ cert_file: "{self.store.broker_cert}", key_file: '
                        f'"{self.store.broker_key}", ca_file: "{self.agent_ca}", '
                        'verify: "optional", timeout: 5 }')
        # JSON is valid NATS config syntax for these values (quoted strings, lists, maps).
        return "\n".join([
            "# Generated by tools/nats/cluster.py (tests and benchmarks).",
            f'server_name: "{node.name}"',
            f'listen: "{self.host}:{node.client_port}"',
            tls,
            f"max_payload: {MAX_PAYLOAD}",
            f'jetstream {{ store_dir: "{node.store_dir}", max_memory_store: 64MB, '
            'max_file_store: 2GB }',
            f'cluster {{ name: "cfnet", listen: "{self.host}:{node.cluster_port}", '
            f"routes: [{routes}] }}",
            self._leafnodes_conf(node, tls),
            f'mqtt {{ listen: "{self.host}:{node.mqtt_port}"',
            f"  {mqtt_tls}",
            # Sessions, retained messages and QoS 1 messages on all three nodes: a
            # killed node loses nothing acknowledged.
            "  stream_replicas: 3",
            "  ack_wait: \"10s\"",
            "  max_ack_pending: 1000 }",
            f"authorization {{ {auth} }}",
            *self._sys_conf(),
            "",
        ])

    def _sys_conf(self) -> list[str]:
        if self.agent_ca is None:
            return []
        # The system account, with the callout's user that kicks revoked nodes' connections.
        users = json.dumps([{"user": CALLOUT_SYS_USER, "password": self.callout_sys_password}])
        return [f"accounts {{ {SYS_ACCOUNT}: {{ users: {users} }} }}",
                f"system_account: {SYS_ACCOUNT}"]

    def _leafnodes_conf(self, node: _Node, tls: str) -> str:
        if not node.leaf_port:
            return ""
        # Leaf connections bind to the global account, as the MQTT users are; what a site
        # may send up is limited on the leaf's side (EdgeLeaf's deny_exports).
        auth = json.dumps({"user": self.leaf_user, "password": self.leaf_password})
        parts = [f'listen: "{self.host}:{node.leaf_port}"', tls, f"authorization: {auth}"]
        return f"leafnodes {{ {', '.join(p for p in parts if p)} }}"

    def _write_confs(self) -> None:
        for n in self.nodes:
            write_conf(n.conf, self.render_conf(n))
        if self.callout:
            path = self.workdir / "callout-accounts.json"
            tmp = path.with_suffix(".tmp")
            write_conf(tmp, json.dumps(callout_accounts(self.store, self.revoked)))
            tmp.replace(path)  # the callout re-reads it on a changed stat, never half-written

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start every node and wait until each accepts MQTT (JetStream up, cluster formed)."""
        if self.binary is None:
            self.binary = build_nats()
        for attempt in range(PORT_ATTEMPTS):
            self._write_confs()
            for n in self.nodes:
                self._spawn(n)
            try:
                for n in self.nodes:
                    self._wait_ready(n)
                break
            except NatsError:
                # Ports are picked free a moment before the servers bind them; another
                # process may bind one in between. Pick new ones and start again.
                if attempt + 1 == PORT_ATTEMPTS or not any(
                        "address already in use" in self.log_tail(n) for n in self.nodes):
                    raise
                self.stop()
                self._pick_ports()
        if self.callout:
            self.start_callout()

    # ------------------------------------------------------------------ the auth callout
    def start_callout(self) -> None:
        """Run ``cloud_core.bus_callout`` against every node; wait until it subscribed."""
        if self._callout_proc is not None and self._callout_proc.poll() is None:
            return
        seed, pw = self.workdir / "callout.seed", self.workdir / "callout.password"
        write_conf(seed, self._callout_seed)
        write_conf(pw, self.callout_password)
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        cmd = [*prefix, sys.executable, "-m", "cloud_core.bus_callout",
               "--nats-url", ",".join(self.nats_urls), "--user", CALLOUT_USER,
               "--password-file", str(pw), "--issuer-seed-file", str(seed),
               "--accounts", str(self.workdir / "callout-accounts.json"),
               "--user-ttl", str(self.callout_ttl_s),
               *self._callout_cert_args(),
               *(["--ca-file", str(self.ca_file)] if self.tls else [])]
        out = open(self.callout_log, "ab")  # noqa: SIM115 - handed to Popen
        with out:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=out, start_new_session=True)
        self._callout_proc = p
        self._rearm_finalizer()
        assert p.stdout is not None
        ready = _read_line(p.stdout, START_TIMEOUT_S)
        p.stdout.close()
        if ready != b"ready\n":
            stop_server(p)
            raise NatsError(f"the auth callout did not start (got {ready!r}): "
                            f"{log_tail(self.callout_log)}")

    def _callout_cert_args(self) -> list[str]:
        if self.agent_ca is None:
            return []
        sys_pw = self.workdir / "callout-sys.password"
        write_conf(sys_pw, self.callout_sys_password)
        return ["--agent-ca", str(self.agent_ca), "--sys-user", CALLOUT_SYS_USER,
                "--sys-password-file", str(sys_pw)]

    def revoke(self, node: str) -> None:
        """Revoke an enrolled node: the callout refuses its certificate from now on and
        cuts off its open connections (it re-reads the accounts file once a second)."""
        self.revoked.add(node)
        self._write_confs()

    def stop_callout(self) -> None:
        """Stop the auth callout (SIGTERM): every new connection is then refused."""
        if self._callout_proc is not None:
            stop_server(self._callout_proc)
            self._callout_proc = None

    def _rearm_finalizer(self) -> None:
        procs = [x.proc for x in self.nodes if x.proc is not None]
        if self._callout_proc is not None:
            procs.append(self._callout_proc)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _terminate_all, procs)

    def _spawn(self, n: _Node) -> None:
        if n.proc is not None and n.proc.poll() is None:
            return
        n.store_dir.mkdir(parents=True, exist_ok=True)
        assert self.binary is not None  # start() set it
        n.proc = spawn_server(self.binary, n.conf, n.log, self.netns)
        self._rearm_finalizer()

    def _wait_ready(self, n: _Node, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            if n.proc is None or n.proc.poll() is not None:
                raise NatsError(f"nats-server {n.name} exited: {self.log_tail(n)}")
            try:
                last = self._probe(n, READY_USER, self._ready_password)
                if last == 0:
                    return
            except OSError as exc:
                last = exc
            time.sleep(0.2)
        raise NatsError(f"{n.name} did not accept MQTT within {timeout_s:.0f}s (last: {last}): "
                        f"{self.log_tail(n)}")

    def start_node(self, i: int) -> None:
        """Start node ``i`` again (same ports, same JetStream store) and wait until ready."""
        self._spawn(self.nodes[i])
        self._wait_ready(self.nodes[i])

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i``: a crash."""
        p = self.nodes[i].proc
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        self.stop_callout()
        for n in self.nodes:
            p = n.proc
            if p is not None and p.poll() is None:
                p.terminate()
        for n in self.nodes:
            if n.proc is not None:
                stop_server(n.proc)
            n.proc = None
        self._finalizer.detach()

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------------ accounts
    # add_account, remove_account, credentials: tools.accounts.BusAccounts.
    def _reload_accounts(self) -> None:
        self._reload()

    def _wait_account(self, creds: Credentials, *, accepted: bool) -> None:
        self._wait_all(creds, accepted=accepted)

    def _reload(self) -> None:
        self._write_confs()
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.send_signal(signal.SIGHUP)

    def _wait_all(self, creds: Credentials, *, accepted: bool) -> None:
        # Through the callout a probe is a TLS connect plus a round trip to a Python
        # process: on a loaded machine give it twice the time.
        deadline = time.monotonic() + RELOAD_TIMEOUT_S * (2 if self.callout else 1)
        for n in self.nodes:
            if n.proc is None or n.proc.poll() is not None:
                continue
            while True:
                try:
                    ok = self._probe(n, creds.username, creds.password) == 0
                except OSError:
                    ok = False
                if ok == accepted:
                    break
                if time.monotonic() > deadline:
                    state = "refused" if accepted else "accepted"
                    raise NatsError(f"{creds.username!r} still {state} by {n.name} after reload")
                time.sleep(0.05)

    def probe(self, username: str | None, password: str | None) -> int:
        """CONNECT to the first running node; the MQTT 3.1.1 CONNACK code (0 accepted)."""
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                return self._probe(n, username, password)
        raise NatsError("no node is running")

    def _probe(self, n: _Node, username: str | None, password: str | None,
               client_id: str | None = None) -> int:
        if client_id is None and self.callout and username and username != READY_USER:
            client_id = wire_client_id(username, "mqtt311")  # the callout wants its own
        return in_netns(self.netns, mqtt_connect_probe, self.host, n.mqtt_port,
                        username=username, password=password, client_id=client_id,
                        ca_file=self.ca_file if self.tls else None)

    # ------------------------------------------------------------------ diagnostics
    def log_tail(self, n: _Node, lines: int = 15) -> str:
        return log_tail(n.log, lines)

    def retained(self, topic: str) -> bytes | None:
        """What the bus's retained store holds for ``topic`` (the raw MQTT payload), or
        None: asked as the harness's admin user over native NATS."""
        import asyncio
        import ssl

        import nats

        async def ask() -> bytes | None:
            tls = ssl.create_default_context(cafile=str(self.ca_file)) if self.tls else None
            nc = await nats.connect(servers=self.nats_urls, user=ADMIN_USER,
                                    password=self.admin_password, tls=tls, connect_timeout=5)
            try:
                body = json.dumps({"last_by_subj": RETAINED_PREFIX + topic_subject(topic)})
                msg = await nc.request(MSG_GET, body.encode(), timeout=5)
            finally:
                await nc.close()
            found = stored_payload(json.loads(msg.data))
            return None if found is None else found[1]

        found: bytes | None = in_netns(self.netns, asyncio.run, ask())
        return found

    def log_text(self) -> str:
        out = []
        for n in self.nodes:
            with contextlib.suppress(OSError):
                out.append(n.log.read_text(errors="replace"))
        return "\n".join(out)


def render_accounts(store: CertStore, *, callout_issuer: str | None = None,
                    callout_password: str | None = None,
                    callout_bypass: tuple[str, ...] = ()) -> str:
    """``authorization { users: [...] }`` for every account of a ``tools.certs`` store: the
    accounts.conf a deployed NATS cluster includes (the chart's Secret
    ``nats.deploy.accountsSecretName``). Passwords as the store holds them; keep the
    Secret as private as the store. With ``callout_issuer`` (the callout's account public
    key) the accounts are the callout's to admit (:func:`callout_accounts`): only the
    callout's own users (and its system-account user's bypass) and the ``auth_callout``
    block are rendered; ``callout_bypass``:
    more users the server admits itself (the hub's leaf user, ``cfnet-leaf``, with
    ``nats.leaf``: a leaf connection would otherwise go to the callout and be refused)."""
    if callout_issuer is None:
        return f"authorization {{ users: {json.dumps(account_users(store), indent=1)} }}\n"
    if not callout_password:
        raise NatsError("a callout config needs the callout user's password")
    users = json.dumps([callout_user(callout_password)], indent=1)
    return (f"authorization {{ users: {users},\n"
            f"{callout_conf(callout_issuer, [CALLOUT_USER, CALLOUT_SYS_USER, *callout_bypass])}"
            " }\n")


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.nats.cluster accounts|callout-accounts|callout-seed --pki DIR``:
    print accounts.conf (``--callout-seed-file``/``--callout-password-file``: the callout
    variant), the callout's accounts file, or a new callout signing seed."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tools.nats.cluster")
    ap.add_argument("what", choices=["accounts", "callout-accounts", "callout-seed"])
    ap.add_argument("--pki", type=Path, default=Path("run/pki"))
    ap.add_argument("--callout-seed-file", type=Path)
    ap.add_argument("--callout-password-file", type=Path)
    ap.add_argument("--callout-bypass", action="append", default=[],
                    help="a user the server admits itself (cfnet-leaf with nats.leaf)")
    ap.add_argument("--revoke", action="append", default=[], metavar="NODE",
                    help="callout-accounts: a node whose enrolled certificate is refused "
                         "(and its open connections cut off); repeat for more")
    a = ap.parse_args(argv)
    if a.what == "callout-seed":
        print(new_account_seed())
        return 0
    if not (a.pki / "accounts.json").exists() and not a.pki.exists():
        print(f"no tools.certs store at {a.pki}", file=sys.stderr)
        return 2
    store = CertStore(a.pki)
    if a.what == "callout-accounts":
        sys.stdout.write(json.dumps(callout_accounts(store, a.revoke), indent=1) + "\n")
        return 0
    issuer = password = None
    if a.callout_seed_file:
        try:
            issuer = account_public(a.callout_seed_file.read_text().strip())
            password = (a.callout_password_file.read_text().strip()
                        if a.callout_password_file else None)
        except (OSError, ValueError) as exc:
            print(f"cannot read the callout's seed or password: {exc}", file=sys.stderr)
            return 2
    try:
        sys.stdout.write(render_accounts(store, callout_issuer=issuer,
                                         callout_password=password,
                                         callout_bypass=tuple(a.callout_bypass)))
    except NatsError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


def _read_line(stream: object, timeout_s: float) -> bytes:
    """One line from a child's stdout pipe, or b"" after ``timeout_s`` (the child hangs)."""
    import select

    fd = stream.fileno()  # type: ignore[attr-defined]
    buf = b""
    deadline = time.monotonic() + timeout_s
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 64)
        if not chunk:
            break
        buf += chunk
    return buf


def _terminate_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=STOP_TIMEOUT_S)


if __name__ == "__main__":
    raise SystemExit(main())
