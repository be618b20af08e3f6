"""The edge sites' sources of the clustered bus's ingest stream (NATS JetStream): linking
each configured site, re-arming a stalled one, removing one no longer configured.

**Edge sites' sources** (docs/nats.md, "Edge sites"): an edge site's leaf node keeps its
agents' reports in its own stream while its uplink is down, and ``CFNET_INGEST`` *sources*
that stream through the site's JetStream domain. nats-server re-creates a failed source
consumer with a growing back-off (``calculateRetryBackoff`` in server/stream.go: 10 s more
per failure, up to 2 minutes) and kicks it at once on a leaf reconnect only on the server
the leaf happened to connect to, and only if that server leads the stream
(``checkInternalSyncConsumers`` in server/leafnode.go). The ``$SYS`` leafnode-connect
advisory is sent only with gateways configured (``sendLeafNodeConnect`` in
server/events.go), so it cannot tell us either. So the core watches for itself
(:class:`SourceResumer`): once a second it reads the stream's source info; a source not
heard from for ``resume_stale_s`` (a healthy one heartbeats every second) whose site
answers again (``$JS.<site>.API.INFO`` across the leaf connection) is re-armed: removed
from the stream's config and added back, which makes the stream leader set it up now; it
resumes after the last message it stored from that source, so nothing arrives twice. At
most once per site per ``resume_min_interval_s``. It lives in the core because the core
is what holds the hub's ingest stream and its credentials; a site's leaf node cannot
reach the hub stream's config, and should not.

**Linking the sites** (``--nats-sites``, :func:`parse_sites`, :func:`link_sites`): the same
look links each configured site that is not linked yet or whose source has gone from
``CFNET_INGEST``: the site's ``CFNET_EDGE`` on its leaf, through its domain
(``$JS.<site>.API.STREAM.INFO``/``CREATE``), then one update of ``CFNET_INGEST`` adding
the missing sources. A site that does not answer is counted and tried again after a
doubling back-off (at most :data:`LINK_BACKOFF_MAX_S`); the others and the fetchers go on.
The sites whose sources the core manages are named in ``CFNET_INGEST``'s metadata
(:data:`SITES_META`); one named there that ``--nats-sites`` no longer names has its source
removed (:meth:`SourceResumer.drop`); a source added by hand is never touched. A stalled
site that answers again without its ``CFNET_EDGE`` (a wiped leaf store) gets it created
again before the re-arm, and nats-server's source reads the new stream from its start
(it tells a re-created stream by its identity).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cloud_core.bus_nats import (
    EDGE_STREAM,
    STREAM,
    STREAM_SUBJECTS,
    NatsIngestError,
    NatsIngestSettings,
)

log = logging.getLogger(__name__)

# The most sources one poll looks at (a deployment's edge sites), and the longest domain
# name taken from the server's answer: bounds on what one poll can cost.
MAX_SOURCES = 4096
MAX_DOMAIN = 64
API_TIMEOUT_S = 2.0
PROBE_TIMEOUT_S = 0.5


# Edge site names: the JetStream domain of the site's leaf. nats-server refuses a domain
# with ".", "*", ">" or whitespace, and the reserved ACK, FC, SNAPSHOT, EVENT
# (validateJetStreamOptions, server/jetstream.go); cfnet keeps to ASCII letters and digits,
# at most 32 (the chart's nats.leaf.sites[].name), so a name is also a Kubernetes name part.
MAX_SITES = 1000
MAX_SITE_LEN = 32
RESERVED_DOMAINS = frozenset({"ACK", "FC", "SNAPSHOT", "EVENT"})
LINK_BACKOFF_MAX_S = 30.0  # a site not answering is tried again at most this far apart
LINK_CONCURRENCY = 32  # sites linked at once in one poll


def valid_site(name: str) -> bool:
    return (0 < len(name) <= MAX_SITE_LEN and name.isascii() and name.isalnum()
            and name not in RESERVED_DOMAINS)


def parse_sites(text: str) -> tuple[str, ...]:
    """``a,b,...`` (``--nats-sites``) as site names; a bad, reserved or repeated name, or
    too many, is a :class:`NatsIngestError` naming it. The length is bounded before the
    split."""
    if len(text) > MAX_SITES * (MAX_SITE_LEN + 2):
        raise NatsIngestError(f"--nats-sites: {len(text)} characters; at most {MAX_SITES} "
                              f"sites of {MAX_SITE_LEN}")
    names = [t.strip() for t in text.split(",") if t.strip()]
    if len(names) > MAX_SITES:
        raise NatsIngestError(f"--nats-sites: {len(names)} sites; at most {MAX_SITES}")
    seen: set[str] = set()
    for n in names:
        if not valid_site(n):
            raise NatsIngestError(
                f"--nats-sites: {n[:MAX_SITE_LEN + 8]!r} is not a site name (a JetStream "
                f"domain: 1-{MAX_SITE_LEN} ASCII letters and digits, not "
                f"{'/'.join(sorted(RESERVED_DOMAINS))})")
        if n in seen:
            raise NatsIngestError(f"--nats-sites: {n!r} is given twice")
        seen.add(n)
    return tuple(names)


def edge_stream_config(settings: NatsIngestSettings) -> dict[str, Any]:
    """A site's ``CFNET_EDGE`` (on its leaf): the site's telemetry and status, in its
    own file store, bounded in bytes and age (the oldest go first)."""
    return {"name": EDGE_STREAM, "subjects": list(STREAM_SUBJECTS), "retention": "limits",
            "storage": "file", "num_replicas": 1, "discard": "old",
            "max_bytes": settings.edge_max_bytes,
            "max_age": int(settings.edge_max_age_s * 1e9)}


def edge_source(site: str) -> dict[str, Any]:
    """``CFNET_INGEST``'s source of a site's ``CFNET_EDGE``, through the site's domain."""
    return {"name": EDGE_STREAM, "external": {"api": f"$JS.{site}.API"}}


async def ensure_edge_stream(nc: Any, site: str, settings: NatsIngestSettings) -> bool:
    """The site's ``CFNET_EDGE`` exists on its leaf (created through the site's JetStream
    domain, ``$JS.<site>.API``, if not); whether it was created now. An existing one is
    left as it is (its limits may have been set by hand). A site that does not answer
    raises (no responders, a timeout)."""
    api = f"$JS.{site}.API"
    try:
        await _api(nc, f"{api}.STREAM.INFO.{EDGE_STREAM}")
        return False
    except JsApiError as exc:
        if exc.err_code != JS_STREAM_NOT_FOUND:
            raise
    await _api(nc, f"{api}.STREAM.CREATE.{EDGE_STREAM}",
               json.dumps(edge_stream_config(settings)).encode())
    return True


# ``CFNET_INGEST``'s metadata key naming the sites whose sources the core manages (those it
# added, or found there for a site it is configured with): a site dropped from
# ``--nats-sites`` has its source removed only if it is named here, so a source someone
# added by hand is never touched. Stream metadata is replicated with the stream's config,
# so every replica, and the next core after a restart, reads the same record.
SITES_META = "cfnet.sites"


def claimed_sites(config: dict[str, Any]) -> set[str]:
    """The sites ``SITES_META`` names in a stream config (bounded; bad names ignored)."""
    meta = config.get("metadata")
    raw = meta.get(SITES_META) if isinstance(meta, dict) else None
    if not isinstance(raw, str) or len(raw) > MAX_SITES * (MAX_SITE_LEN + 1):
        return set()
    return {n for n in raw.split(",") if valid_site(n)}


def _with_claimed(config: dict[str, Any], claimed: set[str]) -> dict[str, Any]:
    meta = config.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    if claimed:
        meta[SITES_META] = ",".join(sorted(claimed))
    else:
        meta.pop(SITES_META, None)
    return {**config, "metadata": meta}


def with_sources(config: dict[str, Any], sites: list[str]) -> dict[str, Any] | None:
    """The stream config with a source for each of ``sites`` it lacks and every one of
    them named in ``SITES_META`` (the rest of the config as it was); None if it has them
    all and names them all."""
    sources = list(config.get("sources") or [])
    have = {source_domain(s) for s in sources if isinstance(s, dict)}
    missing = [site for site in sites if site not in have]
    claimed = claimed_sites(config)
    if not missing and claimed.issuperset(sites):
        return None
    more = {**config, "sources": [*sources, *(edge_source(site) for site in missing)]}
    return _with_claimed(more, claimed | set(sites))


def without_sites(config: dict[str, Any], sites: set[str]) -> dict[str, Any] | None:
    """The stream config less the sources of ``sites`` and less their names in
    ``SITES_META`` (every other source, and the rest of the config, as it was); None if
    there is nothing of them to remove."""
    sources = list(config.get("sources") or [])
    kept = [s for s in sources if not (isinstance(s, dict) and source_domain(s) in sites)]
    claimed = claimed_sites(config)
    if len(kept) == len(sources) and not claimed & sites:
        return None
    return _with_claimed({**config, "sources": kept}, claimed - sites)


async def _stream_config(nc: Any, stream: str) -> dict[str, Any]:
    """The stream's config as the server holds it (raw JSON: no field dropped)."""
    info = await _api(nc, f"$JS.API.STREAM.INFO.{stream}")
    config = info.get("config")
    if not isinstance(config, dict):
        raise NatsIngestError(f"STREAM.INFO {stream}: no config")
    return config


async def ensure_sources(nc: Any, sites: list[str], stream: str = STREAM) -> list[str]:
    """``stream`` sources each site's ``CFNET_EDGE`` (one read and at most one update for
    all: two updates at once from this process would lose one); the sites added now.
    The stream must exist (:class:`cloud_core.bus_nats_ingest.SharedIngest` creates it
    before it links). The sites are named in the stream's ``SITES_META`` as the core's
    (:func:`remove_sources`)."""
    config = await _stream_config(nc, stream)
    more = with_sources(config, sites)
    if more is None:
        return []
    have = {source_domain(s) for s in config.get("sources") or [] if isinstance(s, dict)}
    await _api(nc, f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(more).encode())
    return [site for site in sites if site not in have]


async def remove_sources(nc: Any, sites: list[str], stream: str = STREAM) -> list[str]:
    """Remove the sources of ``sites`` from ``stream`` if ``SITES_META`` names them (the
    core added them; one read, at most one update); the sites whose source was removed."""
    config = await _stream_config(nc, stream)
    mine = claimed_sites(config) & set(sites)
    less = without_sites(config, mine)
    if less is None:
        return []
    had = {source_domain(s) for s in config.get("sources") or [] if isinstance(s, dict)}
    await _api(nc, f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(less).encode())
    return sorted(site for site in mine if site in had)


async def link_sites(nc: Any, sites: list[str], settings: NatsIngestSettings,
                     ) -> tuple[list[str], dict[str, Exception]]:
    """Link edge sites: each one's ``CFNET_EDGE`` first (at most
    :data:`LINK_CONCURRENCY` at once; a source of a stream that does not exist yet would
    fail and wait out the server's back-off), then ``CFNET_INGEST``'s sources of those that
    answered, in one update. Idempotent. (linked, {site: why not})."""
    failed: dict[str, Exception] = {}
    gate = asyncio.Semaphore(LINK_CONCURRENCY)

    async def edge(site: str) -> None:
        async with gate:
            try:
                if await ensure_edge_stream(nc, site, settings):
                    log.info("edge site %s: created its %s", site, EDGE_STREAM)
            except Exception as exc:  # no responders (leaf away), timeout, API error
                failed[site] = exc

    await asyncio.gather(*(edge(site) for site in sites))
    ready = [site for site in sites if site not in failed]
    if ready:
        try:
            for site in await ensure_sources(nc, ready):
                log.info("edge site %s: %s now sources its %s", site, STREAM, EDGE_STREAM)
        except Exception as exc:  # no leader for the stream yet: all of them next time
            for site in ready:
                failed[site] = exc
    return [site for site in sites if site not in failed], failed


def source_domain(source: dict[str, Any]) -> str | None:
    """The JetStream domain of an edge site's source (``external.api`` is
    ``$JS.<domain>.API``); None for a local source or a prefix of another form."""
    ext = source.get("external")
    api = ext.get("api") if isinstance(ext, dict) else None
    if not isinstance(api, str):
        return None
    parts = api.split(".")
    if len(parts) != 3 or parts[0] != "$JS" or parts[2] != "API":
        return None
    domain = parts[1]
    return domain if 0 < len(domain) <= MAX_DOMAIN and domain.isalnum() else None


def stalled_domains(info: dict[str, Any], stale_s: float) -> list[str]:
    """The domains of the edge sources in a ``STREAM.INFO`` answer not heard from for
    ``stale_s`` (``active``: nanoseconds since the source's last message or heartbeat).
    ``active`` -1 (never heard from: a source just added) is left to the server: a
    source that has ever worked keeps its last time across its failures."""
    out = []
    for src in (info.get("sources") or [])[:MAX_SOURCES]:
        if not isinstance(src, dict):
            continue
        domain = source_domain(src)
        if domain is None:
            continue
        active = src.get("active")
        if isinstance(active, int) and active > stale_s * 1e9:
            out.append(domain)
    return out


def without_domain(config: dict[str, Any], domain: str) -> dict[str, Any] | None:
    """The stream config less that site's source; None if it has none."""
    sources = list(config.get("sources") or [])
    kept = [s for s in sources if not (isinstance(s, dict) and source_domain(s) == domain)]
    if len(kept) == len(sources):
        return None
    return {**config, "sources": kept}


class JsApiError(NatsIngestError):
    """The JetStream API answered with an error (``err_code``: the server's error code)."""

    def __init__(self, message: str, err_code: int | None) -> None:
        super().__init__(message)
        self.err_code = err_code


JS_STREAM_NOT_FOUND = 10059  # JSStreamNotFoundErr, server/errors.json


async def _api(nc: Any, subject: str, body: bytes = b"",
               timeout: float = API_TIMEOUT_S) -> dict[str, Any]:
    msg = await nc.request(subject, body, timeout=timeout)
    data = json.loads(msg.data)
    if not isinstance(data, dict):
        raise NatsIngestError(f"{subject}: not a JSON object")
    if data.get("error"):
        err = data["error"]
        code = err.get("err_code") if isinstance(err, dict) else None
        raise JsApiError(f"{subject}: {err}", code if isinstance(code, int) else None)
    return data


async def rearm_source(nc: Any, domain: str, stream: str = STREAM) -> bool:
    """Remove the site's source from ``stream`` and add it back (raw JSON, so no field the
    client library does not know is dropped from the config): the stream leader sets the
    source consumer up at once, resuming after the last message it stored from it.
    Whether the site had a source there."""
    config = await _stream_config(nc, stream)
    less = without_domain(config, domain)
    if less is None:
        return False
    update = f"$JS.API.STREAM.UPDATE.{stream}"
    await _api(nc, update, json.dumps(less).encode())
    await _api(nc, update, json.dumps(config).encode())
    return True


class SourceResumer:
    """Re-arms an edge site's stalled source as soon as the site answers again (module
    docstring). Every core replica runs one: a re-arm by one makes the source active, so
    the others find nothing to do; two at once still end with the source in place (each
    adds back what it removed) and with nothing twice (the source resumes from the stream)."""

    def __init__(self, nc: Any, settings: NatsIngestSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nc = nc
        self.settings = settings
        self.clock = clock
        self.last: dict[str, float] = {}  # domain -> when it was last re-armed
        self.resumed: dict[str, int] = {}  # domain -> how many times (a counter)
        # Linking the configured sites (settings.sites): counters, and when each unlinked
        # one is tried next (a doubling back-off up to LINK_BACKOFF_MAX_S).
        self.linked: dict[str, int] = {}  # site -> times it was linked (source added or found)
        self.link_failures: dict[str, int] = {}  # site -> attempts that failed
        self.unlinked: set[str] = set(settings.sites)
        # A site dropped from --nats-sites whose source this core had added: removed.
        self.removed: dict[str, int] = {}  # site -> times its source was removed
        # A stalled site that answers again without its CFNET_EDGE (a wiped or new leaf
        # store): the stream created again (nats-server's source then reads the new
        # stream from its start: it tells a re-created stream by its identity).
        self.recreated: dict[str, int] = {}
        self._next_try: dict[str, float] = {}
        self._backoff: dict[str, float] = {}

    EVENTS = ("linked", "link_failures", "resumed", "removed", "recreated")

    def counts(self) -> dict[str, dict[str, int]]:
        """Every counter, per site (copies): what the core's child process reports to the
        core (``cfnet_edge_site_events_total``)."""
        return {k: dict(getattr(self, k)) for k in self.EVENTS}

    async def run(self, stopping: threading.Event) -> None:
        s = self.settings
        while not stopping.is_set():
            try:
                await self.poll()
            except Exception as exc:  # no leader for the stream yet, a node away: next poll
                log.debug("edge sources: %s", exc)
            await asyncio.sleep(s.resume_poll_s)

    async def poll(self) -> list[str]:
        """One look: link the configured sites not linked yet (:meth:`link`); the domains
        re-armed now."""
        s = self.settings
        try:
            info = await _api(self.nc, f"$JS.API.STREAM.INFO.{STREAM}")
        except NatsIngestError:
            return []  # no such stream (yet): nothing sourced
        if s.sites:
            await self.link(info)
        await self.drop(info)
        if not s.resume_sources:
            return []
        done = []
        now = self.clock()
        for domain in stalled_domains(info, s.resume_stale_s):
            if now - self.last.get(domain, -1e18) < s.resume_min_interval_s:
                continue
            if not await self._site_answers(domain):
                continue  # uplink still down: the server's own retries are enough
            self.last[domain] = now
            if domain in s.sites:
                # It answers again: its stream may be gone (a wiped store), make sure.
                # The re-arm below then reads the new stream from its start: the source
                # consumer's create names the old stream's identity (a hash of its created
                # time, kept with the source's state on the hub), the leaf refuses it for
                # the new stream, and the hub's server starts that source over from
                # sequence 1 (nats-server >= 2.12, API level 5; server/stream.go
                # setupSourceConsumer). What the hub stored from the old stream stays.
                try:
                    if await ensure_edge_stream(self.nc, domain, s):
                        n = self.recreated[domain] = self.recreated.get(domain, 0) + 1
                        log.warning("edge site %s answers again without its %s (a wiped or "
                                    "new leaf store; %d times): created it again, the hub "
                                    "reads it from its start", domain, EDGE_STREAM, n)
                except Exception as exc:  # the re-arm below goes on; the next stall retries
                    log.info("edge site %s: checking its %s: %s", domain, EDGE_STREAM, exc)
            if await rearm_source(self.nc, domain):
                self.resumed[domain] = self.resumed.get(domain, 0) + 1
                log.info("edge site %s answers again: re-armed its source of %s",
                         domain, STREAM)
                done.append(domain)
        return done

    async def link(self, info: dict[str, Any]) -> list[str]:
        """Link the configured sites that are due: those never linked, and those whose
        source has gone from ``CFNET_INGEST`` (``info``: its ``STREAM.INFO``). A site that
        does not answer (its leaf not up yet, its uplink down) is counted, logged and
        tried again after a doubling back-off; the others, and ingest, go on. The sites
        linked now."""
        s = self.settings
        config = info.get("config")
        sources = config.get("sources") if isinstance(config, dict) else None
        have = {source_domain(x) for x in (sources or [])[:MAX_SOURCES] if isinstance(x, dict)}
        self.unlinked |= {site for site in s.sites if site not in have}
        now = self.clock()
        due = [site for site in s.sites
               if site in self.unlinked and self._next_try.get(site, -1e18) <= now]
        if not due:
            return []
        ok, failed = await link_sites(self.nc, due, s)
        for site in ok:
            self.unlinked.discard(site)
            self._backoff.pop(site, None)
            self._next_try.pop(site, None)
            self.linked[site] = self.linked.get(site, 0) + 1
            log.info("edge site %s linked: %s on its leaf, sourced by %s", site,
                     EDGE_STREAM, STREAM)
        for site, exc in failed.items():
            n = self.link_failures[site] = self.link_failures.get(site, 0) + 1
            wait = min(self._backoff.get(site, s.resume_poll_s / 2) * 2, LINK_BACKOFF_MAX_S)
            self._backoff[site] = wait
            self._next_try[site] = now + wait
            # The first failure and then one in ten: a site down for hours says so, not
            # every few seconds.
            (log.warning if n == 1 or n % 10 == 0 else log.debug)(
                "edge site %s not linked (%d attempts): %s; next try in %.0f s", site, n,
                exc or type(exc).__name__, wait)
        return ok

    async def drop(self, info: dict[str, Any]) -> list[str]:
        """Remove the sources of the sites this core (or another replica, or an earlier
        run) added that ``--nats-sites`` no longer names (``SITES_META`` of ``info``'s
        config); a source not named there, added by hand, is never touched. Counted
        (:attr:`removed`) and logged; the sites whose source was removed now."""
        config = info.get("config")
        if not isinstance(config, dict):
            return []
        gone = sorted(claimed_sites(config) - set(self.settings.sites))
        if not gone:
            return []
        done = await remove_sources(self.nc, gone)
        for site in done:
            self.removed[site] = self.removed.get(site, 0) + 1
            self.last.pop(site, None)
            log.warning("edge site %s is no longer configured (--nats-sites): removed its "
                        "source from %s (its leaf's %s is left as it is)", site, STREAM,
                        EDGE_STREAM)
        return done

    async def _site_answers(self, domain: str) -> bool:
        try:
            await _api(self.nc, f"$JS.{domain}.API.INFO", timeout=PROBE_TIMEOUT_S)
            return True
        except Exception:  # no responders (leaf away), timeout, or an error answer
            return False
