"""An edge site's NATS leaf node: agents keep publishing while the site's uplink is down.

The site runs one ``nats-server`` (in the lab: inside the site's network namespace) that
its agents connect to over MQTT, exactly as they would to the cloud's cluster: the same
accounts, passwords and cfnet ACL (:func:`tools.nats.cluster.nats_permissions`, from the
hub's :class:`~tools.certs.CertStore`), the same CA and certificate (the hub's, whose
SANs include the leaf's address). The leaf connects up to the hub cluster as a NATS
*leaf node* (every hub node's leafnode listener, user ``NatsCluster.leaf_user``, TLS).

Store-and-forward is **JetStream on the leaf** (its own JetStream domain, the site's
name, which MQTT needs anyway):

- the leaf's stream ``CFNET_EDGE`` captures the site's telemetry and status subjects in
  the site's own file store (bounded by ``max_bytes`` and ``max_age_s``);
- the hub's ingest stream ``CFNET_INGEST`` (:mod:`cloud_core.bus_nats`, where the core
  replicas fetch from) *sources* that stream across the leaf connection through the
  site's JetStream domain (``$JS.<site>.API``). While the uplink is down the source
  stalls and the leaf keeps storing; when it heals the source resumes from where it
  stopped, so what the site stored reaches the core once, in order;
- the leaf does not also send those subjects up live (``deny_exports``): the source is
  their only way up, so the hub stream holds each report once.

Everything else (placements, acks, console) flows over the leaf connection as plain
NATS while it is up, and not while it is down. Limits of this harness and design:
docs/nats.md, "Edge sites".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from cloud_core.bus_nats import (
    EDGE_MAX_AGE_S,
    EDGE_MAX_BYTES,
    EDGE_STREAM,
    STREAM,
    STREAM_SUBJECTS,
    NatsIngestSettings,
)
from cloud_core.bus_nats_sites import link_sites, valid_site
from tools.broker import free_port, mqtt_connect_probe
from tools.nats.cluster import (
    ADMIN_USER,
    NatsCluster,
    NatsError,
    account_users,
    build_nats,
    log_tail,
    spawn_server,
    stop_server,
    tls_block,
    write_conf,
)
from tools.netns import in_netns

__all__ = ["EDGE_STREAM", "EdgeLeaf", "link_site", "render_remote"]

START_TIMEOUT_S = 60.0
# How fast a cut uplink is noticed and retried: the leaf pings every second and gives up
# after 3 missed pongs, then redials every second (NATS's defaults are minutes).
PING_INTERVAL = "1s"
PING_MAX = 3
RECONNECT = "1s"


def render_remote(urls: list[str], user: str, password: str, ca_file: Path | str | None,
                  *, reconnect: str = RECONNECT) -> str:
    """The leaf's ``leafnodes { ... }`` block: dial every hub URL (``nats-leaf://host:port``)
    as ``user``, TLS checked against ``ca_file``, and keep the site's telemetry and status
    off the live link. The harness writes it into the leaf's config; a deployed site
    includes it from the chart's Secret (``python -m tools.nats.leaf remote``)."""
    bad = [u for u in urls if not u.startswith("nats-leaf://") or "@" in u]
    if not urls or bad:
        raise NatsError(f"hub leafnode URLs must be nats-leaf://host:port: {bad or urls}")
    if not password or any(not (c.isalnum() or c in "-_.~") for c in user + password):
        # They go into the URL's userinfo unescaped; a generated password is hex.
        raise NatsError("the leaf user and password must be URL-safe characters, not empty")
    remote: dict[str, Any] = {
        "urls": [u.replace("nats-leaf://", f"nats-leaf://{user}:{password}@") for u in urls],
        # The site's telemetry and status go up only through the hub stream's source
        # (once each); sent live as well they would land in it twice.
        "deny_exports": list(STREAM_SUBJECTS),
    }
    if ca_file is not None:
        remote["tls"] = {"ca_file": str(ca_file)}
    return f'leafnodes {{ reconnect: "{reconnect}", remotes: [{json.dumps(remote)}] }}'


class EdgeLeaf:
    """One site's leaf node (MQTT for its agents, JetStream domain = the site). Context
    manager; :meth:`start` waits until agents can connect and the uplink is up."""

    def __init__(self, workdir: Path, hub: NatsCluster, *, site: str, host: str = "127.0.0.1",
                 netns: str | None = None, max_bytes: int = EDGE_MAX_BYTES,
                 max_age_s: float = EDGE_MAX_AGE_S, uplinks: list[str] | None = None) -> None:
        """``uplinks``: the hub leafnode URLs to dial (default every hub node's)."""
        if not valid_site(site):
            raise NatsError(f"site {site!r}: a JetStream domain is 1-32 ASCII letters and "
                            "digits, not a reserved name")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o700)
        self.hub = hub
        self.site = site
        self.host = host
        self.netns = netns
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.uplinks = list(uplinks) if uplinks is not None else None
        self.admin_password = os.urandom(12).hex()

        def port() -> int:
            return in_netns(netns, free_port, host)

        self.client_port, self.mqtt_port, self.monitor_port = port(), port(), port()
        self.conf = self.workdir / "leaf.conf"
        self.log = self.workdir / "leaf.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ Broker-like surface
    @property
    def port(self) -> int:
        return self.mqtt_port

    @property
    def tls(self) -> bool:
        return self.hub.tls

    @property
    def ca_file(self) -> Path:
        return self.hub.ca_file

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.client_port}"

    def render_conf(self) -> str:
        store = self.hub.store
        tls = tls_block(store) if self.tls else ""
        users: list[dict[str, Any]] = [
            {"user": ADMIN_USER, "password": self.admin_password,
             "allowed_connection_types": ["STANDARD", "MQTT"]}, *account_users(store)]
        urls = self.uplinks if self.uplinks is not None else self.hub.leaf_urls
        if not urls:
            raise NatsError("the hub cluster has no leafnode listener (leafnodes=True)")
        return "\n".join([
            "# Generated by tools/nats/leaf.py (an edge site's leaf node; tests, lab).",
            f'server_name: "leaf-{self.site}"',
            f'listen: "{self.host}:{self.client_port}"',
            f'http: "{self.host}:{self.monitor_port}"',
            tls,
            f'ping_interval: "{PING_INTERVAL}"',
            f"ping_max: {PING_MAX}",
            f'jetstream {{ store_dir: "{self.workdir / "js"}", domain: "{self.site}", '
            f"max_memory_store: 64MB, max_file_store: {max(self.max_bytes * 2, 64 << 20)} }}",
            f'mqtt {{ listen: "{self.host}:{self.mqtt_port}"',
            f"  {tls} }}",
            render_remote(urls, self.hub.leaf_user, self.hub.leaf_password,
                          store.ca_file if self.tls else None),
            f"authorization {{ users: {json.dumps(users)} }}",
            "",
        ])

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        binary = self.hub.binary or build_nats()
        write_conf(self.conf, self.render_conf())
        self.proc = spawn_server(binary, self.conf, self.log, self.netns)
        try:
            self._wait(lambda: self._mqtt_ready(), "accept MQTT")
            self._wait(self.uplink_up, "connect to the hub")
        except BaseException:
            self.stop()
            raise

    def reload(self) -> None:
        """Rewrite the config (accounts added to the hub's store since) and SIGHUP."""
        write_conf(self.conf, self.render_conf())
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None:
            stop_server(p)

    def __enter__(self) -> EdgeLeaf:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _wait(self, ready: Any, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise NatsError(f"leaf-{self.site} exited: {self.log_tail()}")
            with contextlib.suppress(OSError):
                if ready():
                    return
            time.sleep(0.1)
        raise NatsError(f"leaf-{self.site} did not {what} within {timeout_s:.0f}s: "
                        f"{self.log_tail()}")

    def _mqtt_ready(self) -> bool:
        return in_netns(self.netns, mqtt_connect_probe, self.host, self.mqtt_port,
                        username=ADMIN_USER, password=self.admin_password,
                        ca_file=self.ca_file if self.tls else None) == 0

    def monitor(self, endpoint: str) -> dict[str, Any]:
        """The leaf's monitoring endpoint (``leafz``, ``jsz``, ...) as JSON."""
        url = f"http://{self.host}:{self.monitor_port}/{endpoint}"

        def get() -> dict[str, Any]:
            with urllib.request.urlopen(url, timeout=5) as r:
                data: dict[str, Any] = json.loads(r.read())
                return data

        return in_netns(self.netns, get)

    def uplink_up(self) -> bool:
        """Whether the leaf connection to the hub is established (leafz)."""
        return bool(self.monitor("leafz").get("leafnodes"))

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log, lines)


async def _connect(url: str, user: str, password: str, ca_file: Path | None) -> Any:
    import nats

    return await nats.connect(servers=[url], user=user, password=password,
                              tls=ssl.create_default_context(cafile=str(ca_file))
                              if ca_file else None,
                              connect_timeout=5, max_reconnect_attempts=0,
                              allow_reconnect=False)


def link_site(leaf: EdgeLeaf, *, hub_replicas: int = 3, hub_max_age_s: float = 900.0) -> None:
    """Link the site without a core (tests of the hub stream alone): create the hub's
    ``CFNET_INGEST`` as the core would if it is not there yet, then the core's own
    linking (:func:`cloud_core.bus_nats_sites.link_sites`: the leaf's ``CFNET_EDGE`` through
    the site's JetStream domain, and the hub stream's source of it), as the harness's
    admin. A core run with ``--nats-sites`` does this by itself. Idempotent."""
    from nats.js.api import StorageType, StreamConfig

    hub = leaf.hub
    settings = NatsIngestSettings(urls=tuple(hub.nats_urls), username=ADMIN_USER,
                                  password=hub.admin_password, sites=(leaf.site,),
                                  edge_max_bytes=leaf.max_bytes, edge_max_age_s=leaf.max_age_s)

    async def on_hub() -> None:
        nc = await _connect(hub.nats_urls[0], ADMIN_USER, hub.admin_password,
                            hub.ca_file if hub.tls else None)
        try:
            js = nc.jetstream()
            try:
                await js.stream_info(STREAM)
            except Exception:  # nats-py NotFoundError, or an API error: create it
                await js.add_stream(StreamConfig(
                    name=STREAM, subjects=list(STREAM_SUBJECTS),
                    num_replicas=min(hub_replicas, len(hub.nodes)), max_age=hub_max_age_s,
                    storage=StorageType.FILE))
            _, failed = await link_sites(nc, [leaf.site], settings)
            if failed:
                raise NatsError(f"linking site {leaf.site}: {failed[leaf.site]}")
        finally:
            await nc.close()

    in_netns(hub.netns, asyncio.run, on_hub())


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.nats.leaf remote --hub-url URL... --password-file F [--ca PATH]``:
    print the ``remote.conf`` a deployed site's leaf node includes (the chart's
    ``nats.leaf.secretName``). The password is read from a file, not the command line."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m tools.nats.leaf")
    ap.add_argument("what", choices=["remote"])
    ap.add_argument("--hub-url", action="append", required=True,
                    help="the hub's leafnode listener, nats-leaf://host:7422 (repeatable)")
    ap.add_argument("--user", default=NatsCluster.leaf_user)
    ap.add_argument("--password-file", type=Path, required=True)
    ap.add_argument("--ca", default="/etc/nats/tls/ca.crt",
                    help="the CA file as the leaf's pod sees it ('' for no TLS)")
    ap.add_argument("--reconnect", default="5s")
    a = ap.parse_args(argv)
    try:
        password = a.password_file.read_text().strip()
        sys.stdout.write(render_remote(a.hub_url, a.user, password, a.ca or None,
                                       reconnect=a.reconnect) + "\n")
    except (OSError, NatsError) as exc:
        print(f"tools.nats.leaf: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
