"""The bus adapter's pure parts: the 3.1.1 envelope that replaces MQTT 5 properties, the
client id NATS accepts, topic <-> subject mapping and the NATS permissions rendered from
the cfnet ACL (the same paths run against a real NATS cluster in
tests/integration/test_bus.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent import wire
from edge_agent.wire.errors import MqttError
from edge_agent.wire.mqtt import protocol_for_bus, unwrap, wire_client_id, wrap
from tools.nats.cluster import mqtt_to_subject, nats_permissions, subject_to_topic

NODE = st.from_regex(r"\A[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?\Z")


@given(st.binary(max_size=300), st.one_of(st.none(), st.binary(min_size=1, max_size=32)),
       st.one_of(st.none(), st.floats(1.0, 4e9)))
def test_envelope_round_trip(payload: bytes, corr: bytes | None, exp: float | None) -> None:
    body, c, x = unwrap(wrap(payload, corr, exp))
    assert body == payload and c == corr
    assert (x is None) == (exp is None) and (exp is None or abs(x - exp) < 0.01)  # type: ignore


@given(st.binary(max_size=200))
def test_anything_without_a_valid_envelope_passes_unchanged(payload: bytes) -> None:
    body, c, _x = unwrap(payload)
    if c is None:
        assert body == payload or payload.startswith(b"\x1ecf1")


def test_malformed_envelopes_pass_unchanged() -> None:
    for bad in (b"\x1ecf1", b"\x1ecf1\xff\xff{}", b"\x1ecf1\x00\x05{nope", b'\x1ecf1\x00\x02[]x'):
        assert unwrap(bad) == (bad, None, None)
    assert unwrap(b'{"cmd":"nodes"}') == (b'{"cmd":"nodes"}', None, None)


def test_json_payload_never_mistaken_for_an_envelope() -> None:
    assert wrap(b'{"a":1}', None, None) == b'{"a":1}'


@given(NODE)
def test_client_id_has_no_dot_on_nats_and_stays_distinct(node: str) -> None:
    cid = wire_client_id(f"agent-{node}", "mqtt311")
    assert "." not in cid and cid.replace("~", ".") == f"agent-{node}"
    assert wire_client_id(node, "mqtt5") == node


def test_bus_names() -> None:
    assert protocol_for_bus("mosquitto") == "mqtt5"
    assert protocol_for_bus("nats") == "mqtt311"
    with pytest.raises(MqttError):
        protocol_for_bus("emqx")


@given(NODE)
def test_topic_subject_round_trip(node: str) -> None:
    for topic in (wire.telemetry_topic(node), wire.status_topic(node), wire.ack_topic(node)):
        subj = mqtt_to_subject(topic)
        assert subject_to_topic(subj) == topic
        assert subj.replace("//", "").count(".") == topic.count("/")


def test_wildcards_map_to_nats_wildcards() -> None:
    assert mqtt_to_subject("cfnet/v1/nodes/+/telemetry") == "cfnet.v1.nodes.*.telemetry"
    assert mqtt_to_subject("cfnet/v1/#") == "cfnet.v1.>"
    assert mqtt_to_subject("cfnet/v1/nodes/a.b/ack") == "cfnet.v1.nodes.a//b.ack"


def test_agent_permissions_name_only_its_own_subjects() -> None:
    p = nats_permissions("edge.a", "agent")
    pub = p["publish"]["allow"]  # type: ignore[index]
    sub = p["subscribe"]["allow"]  # type: ignore[index]
    assert sorted(pub) == ["cfnet.v1.nodes.edge//a.status", "cfnet.v1.nodes.edge//a.telemetry"]
    assert sorted(sub) == ["$MQTT.sub.>", "cfnet.v1.nodes.edge//a.ack",
                           "cfnet.v1.nodes.edge//a.placements"]
    assert not any("*" in s or ">" in s for s in pub)


def test_core_permissions_have_no_share_prefix() -> None:
    p = nats_permissions("core-0", "core")
    every = p["publish"]["allow"] + p["subscribe"]["allow"]  # type: ignore[index,operator]
    assert not any("$share" in s for s in every)
    assert "cfnet.v1.nodes.*.telemetry" in p["subscribe"]["allow"]  # type: ignore[index]


def test_failover_flag_parsed_and_bounded() -> None:
    from cloud_core.broker_args import parse_failover
    from cloud_core.errors import CoreError

    assert parse_failover("") == ()
    assert parse_failover("a:1, [::1]:8883") == (("a", 1), ("::1", 8883))
    for bad in ("a", "a:", ":1", "a:0", "a:70000", "a:x"):
        with pytest.raises(CoreError):
            parse_failover(bad)
    with pytest.raises(CoreError):
        parse_failover(",".join(f"h{i}:1" for i in range(17)))


def test_agent_config_bus_checked() -> None:
    from edge_agent.config import AgentConfig, validate
    from edge_agent.errors import ConfigError

    ok = validate(AgentConfig(node="n1", bus="nats", broker_failover=("h:8883",)))
    assert ok.bus == "nats"
    for cfg in (AgentConfig(node="n1", bus="emqx"),
                AgentConfig(node="n1", broker_failover=("h",))):
        with pytest.raises(ConfigError):
            validate(cfg)


def test_shared_filters_are_refused_on_mqtt311() -> None:
    from edge_agent.wire.mqtt import MqttClient, MqttSettings

    c = MqttClient(MqttSettings(protocol="mqtt311", tls=False, client_id="x"))
    with pytest.raises(MqttError):
        c.subscribe("$share/g/cfnet/v1/nodes/+/telemetry")
    c.subscribe("cfnet/v1/nodes/+/telemetry")  # an ordinary filter is fine


# ---------------------------------------------------------------------- edge sources
# SourceResumer's decisions on STREAM.INFO answers (the same path against a real hub, leaf
# and partition: tests/integration/test_bus_leaf_resume.py).
def _src(api: str | None, active: object) -> dict[str, object]:
    s: dict[str, object] = {"name": "CFNET_EDGE", "active": active}
    if api is not None:
        s["external"] = {"api": api, "deliver": ""}
    return s


def test_only_stale_edge_sources_count_as_stalled() -> None:
    from cloud_core.bus_nats_sites import stalled_domains

    info = {"sources": [
        _src("$JS.edgea.API", 9_000_000_000),  # 9 s unheard: stalled
        _src("$JS.edgeb.API", 800_000_000),  # heartbeat 0.8 s ago: healthy
        _src("$JS.edgec.API", -1),  # just added, never heard: the server's business
        _src(None, 60_000_000_000),  # a local source: not an edge site
        _src("$JS.API", 60_000_000_000),  # no domain
        _src("$JS.a.b.API", 60_000_000_000),  # not a domain prefix this core made
        _src("$JS.bad-name.API", 60_000_000_000),  # a domain is letters and digits
        _src("$JS." + "x" * 65 + ".API", 60_000_000_000),  # longer than any site name
        _src("$JS.edged.API", "soon"),  # not a number
        "not a source",
    ]}
    assert stalled_domains(info, 3.0) == ["edgea"]
    assert stalled_domains({}, 3.0) == [] and stalled_domains({"sources": None}, 3.0) == []


def test_without_domain_removes_only_that_site_and_keeps_the_rest_of_the_config() -> None:
    from cloud_core.bus_nats_sites import without_domain

    cfg = {"name": "CFNET_INGEST", "future_field": {"kept": True},
           "sources": [_src("$JS.edgea.API", 1), _src("$JS.edgeb.API", 1)]}
    less = without_domain(cfg, "edgea")
    assert less is not None and less["future_field"] == {"kept": True}
    assert [s["external"]["api"] for s in less["sources"]] == ["$JS.edgeb.API"]
    assert len(cfg["sources"]) == 2  # type: ignore[arg-type]  # the original untouched
    assert without_domain(cfg, "edgez") is None


def test_core_may_rearm_its_stream_and_probe_sites_but_not_touch_other_streams() -> None:
    allow = nats_permissions("core-0", "core")["publish"]["allow"]  # type: ignore[index]
    assert "$JS.API.STREAM.UPDATE.CFNET_INGEST" in allow and "$JS.*.API.INFO" in allow
    assert not [s for s in allow if "UPDATE" in s and not s.endswith("CFNET_INGEST")]
    agent = nats_permissions("edge-a", "agent")["publish"]["allow"]  # type: ignore[index]
    assert not [s for s in agent if s.startswith("$JS")]


class _FakeNats:
    """A fake NATS connection (the I/O edge): answers the JetStream API requests
    SourceResumer makes from a dict, records them; a site is reachable or not."""

    def __init__(self, active_ns: int) -> None:
        self.reachable = False
        self.requests: list[str] = []
        self.config = {"name": "CFNET_INGEST", "sources": [_src("$JS.edgea.API", 0)]}
        self.active_ns = active_ns

    async def request(self, subject: str, body: bytes, timeout: float) -> object:
        import json
        from types import SimpleNamespace

        self.requests.append(subject)
        if subject == "$JS.API.STREAM.INFO.CFNET_INGEST":
            srcs = [{**s, "active": self.active_ns} for s in self.config["sources"]]  # type: ignore[attr-defined]
            data: object = {"config": self.config, "sources": srcs}
        elif subject == "$JS.API.STREAM.UPDATE.CFNET_INGEST":
            self.config = json.loads(body)
            data = {"config": self.config}
        elif subject == "$JS.edgea.API.INFO":
            if not self.reachable:
                raise TimeoutError("no responders")
            data = {"type": "io.nats.jetstream.api.v1.account_info_response"}
        else:
            data = {"error": {"code": 403, "description": f"unexpected {subject}"}}
        return SimpleNamespace(data=json.dumps(data).encode())


def test_resumer_rearms_a_stalled_site_once_when_it_answers_and_at_most_once_per_interval(
        ) -> None:
    import asyncio

    from cloud_core.bus_nats import NatsIngestSettings
    from cloud_core.bus_nats_sites import SourceResumer

    nc = _FakeNats(active_ns=30_000_000_000)
    now = [100.0]
    r = SourceResumer(nc, NatsIngestSettings(urls=("tls://x:4222",), username="c",
                                             password="p"), clock=lambda: now[0])
    assert asyncio.run(r.poll()) == []  # stalled, but the site does not answer: left alone
    assert "$JS.API.STREAM.UPDATE.CFNET_INGEST" not in nc.requests
    nc.reachable = True
    assert asyncio.run(r.poll()) == ["edgea"]
    updates = [s for s in nc.requests if "UPDATE" in s]
    assert len(updates) == 2 and nc.config["sources"][0]["external"]["api"] == "$JS.edgea.API"  # type: ignore[index]
    now[0] += 5.0  # still stalled 5 s later (the server has not set it up yet): not again
    assert asyncio.run(r.poll()) == []
    now[0] += 6.0  # past the per-site interval
    assert asyncio.run(r.poll()) == ["edgea"] and r.resumed == {"edgea": 2}
    nc.active_ns = 500_000_000  # healthy: nothing to do
    now[0] += 60.0
    assert asyncio.run(r.poll()) == []


# ---------------------------------------------------------------- linking edge sites
# (--nats-sites; the real leaf and hub: tests/integration/test_bus_leaf_resume.py)
def test_site_names_are_jetstream_domains_bounded_and_each_refusal_names_the_site() -> None:
    from cloud_core.bus_nats import NatsIngestError
    from cloud_core.bus_nats_sites import MAX_SITES, parse_sites

    assert parse_sites("") == () and parse_sites(" a , B2 ,") == ("a", "B2")
    assert parse_sites("x" * 32) == ("x" * 32,)
    for bad in ("a.b", "a*", "a>", "a b", "edge-1", "é", "x" * 33, "ACK", "SNAPSHOT"):
        with pytest.raises(NatsIngestError, match="not a site name") as e:
            parse_sites(f"ok,{bad}")
        assert repr(bad[:40]) in str(e.value)
    with pytest.raises(NatsIngestError, match="'a' is given twice"):
        parse_sites("a,b,a")
    with pytest.raises(NatsIngestError, match=f"at most {MAX_SITES}"):
        parse_sites(",".join(f"s{i}" for i in range(MAX_SITES + 1)))
    with pytest.raises(NatsIngestError, match="characters"):
        parse_sites("a" * 100_000)  # refused before it is split


def test_cfnet_core_takes_sites_only_with_shared_ingest_on_nats(monkeypatch: pytest.MonkeyPatch,
                                                                ) -> None:
    from cloud_core.errors import CoreError
    from cloud_core.main import build_config, parse_args

    base = ["--password", "p", "--db", "/nonexistent/core.db"]
    nats = ["--bus", "nats", "--share-group", "g", "--nats-url", "tls://h:4222"]
    cfg = build_config(parse_args([*base, *nats, "--nats-sites", "siteA,siteB"]))
    assert cfg.nats is not None and cfg.nats.sites == ("siteA", "siteB")
    monkeypatch.setenv("CFNET_NATS_SITES", "s1")  # the chart's cfnet-bus ConfigMap
    cfg = build_config(parse_args([*base, *nats]))
    assert cfg.nats is not None and cfg.nats.sites == ("s1",)
    with pytest.raises(CoreError, match="'bad-site' is not a site name"):
        build_config(parse_args([*base, *nats, "--nats-sites", "bad-site"]))
    with pytest.raises(CoreError, match="needs --bus nats and --share-group"):
        build_config(parse_args([*base, "--nats-sites", "s1"]))


def test_core_may_create_and_read_only_the_edge_stream_on_sites() -> None:
    allow = nats_permissions("core-0", "core")["publish"]["allow"]  # type: ignore[index]
    site = [s for s in allow if s.startswith("$JS.*.")]
    assert sorted(site) == ["$JS.*.API.INFO", "$JS.*.API.STREAM.CREATE.CFNET_EDGE",
                            "$JS.*.API.STREAM.INFO.CFNET_EDGE"]


class _FakeHubAndLeaves:
    """A fake NATS connection (the I/O edge) for linking: the hub's CFNET_INGEST and each
    answering site's leaf streams as dicts; a site not in ``leaves`` has no responders.
    Records every request."""

    def __init__(self, leaves: dict[str, dict[str, object]]) -> None:
        self.leaves = leaves
        self.requests: list[str] = []
        self.config: dict[str, object] = {"name": "CFNET_INGEST", "max_age": 9,
                                          "sources": [_src("$JS.other.API", 1)]}

    async def request(self, subject: str, body: bytes, timeout: float) -> object:
        import json
        from types import SimpleNamespace

        self.requests.append(subject)
        data: object
        if subject == "$JS.API.STREAM.INFO.CFNET_INGEST":
            data = {"config": self.config, "sources": self.config["sources"]}
        elif subject == "$JS.API.STREAM.UPDATE.CFNET_INGEST":
            self.config = json.loads(body)
            data = {"config": self.config}
        else:
            site, api = subject.split(".")[1], ".".join(subject.split(".")[3:])
            if site not in self.leaves:
                raise TimeoutError("no responders")
            streams = self.leaves[site]
            if api == "STREAM.INFO.CFNET_EDGE":
                data = ({"config": streams["CFNET_EDGE"]} if "CFNET_EDGE" in streams else
                        {"error": {"code": 404, "err_code": 10059,
                                   "description": "stream not found"}})
            elif api == "STREAM.CREATE.CFNET_EDGE":
                streams["CFNET_EDGE"] = json.loads(body)
                data = {"config": streams["CFNET_EDGE"]}
            else:
                data = {"error": {"code": 403, "description": f"unexpected {subject}"}}
        return SimpleNamespace(data=json.dumps(data).encode())


def _apis(config: dict[str, object]) -> list[str]:
    return [s["external"]["api"] for s in config["sources"]]  # type: ignore[attr-defined,index]


def test_linking_creates_the_edge_stream_then_adds_the_source_once_and_is_idempotent() -> None:
    import asyncio

    from cloud_core.bus_nats import EDGE_MAX_BYTES, NatsIngestSettings
    from cloud_core.bus_nats_sites import link_sites

    nc = _FakeHubAndLeaves({"a": {}, "b": {"CFNET_EDGE": {"name": "CFNET_EDGE",
                                                          "max_bytes": 5}}})
    s = NatsIngestSettings(urls=("tls://x:4222",), username="c", password="p",
                           sites=("a", "b"))
    ok, failed = asyncio.run(link_sites(nc, ["a", "b"], s))
    assert ok == ["a", "b"] and not failed
    edge = nc.leaves["a"]["CFNET_EDGE"]
    assert edge["max_bytes"] == EDGE_MAX_BYTES and edge["max_age"] == 7 * 86400 * 10**9  # type: ignore[index]
    assert edge["subjects"] and edge["discard"] == "old"  # type: ignore[index]
    assert nc.leaves["b"]["CFNET_EDGE"] == {"name": "CFNET_EDGE", "max_bytes": 5}  # left as is
    # The site's stream exists before the hub sources it; both sources in one update,
    # the rest of the hub stream's config kept.
    assert nc.requests.index("$JS.a.API.STREAM.CREATE.CFNET_EDGE") < \
        nc.requests.index("$JS.API.STREAM.UPDATE.CFNET_INGEST")
    assert nc.requests.count("$JS.API.STREAM.UPDATE.CFNET_INGEST") == 1
    assert _apis(nc.config) == ["$JS.other.API", "$JS.a.API", "$JS.b.API"]
    assert nc.config["max_age"] == 9
    nc.requests.clear()
    assert asyncio.run(link_sites(nc, ["a", "b"], s)) == (["a", "b"], {})  # again: no change
    assert not [r for r in nc.requests if "CREATE" in r or "UPDATE" in r], nc.requests


def test_a_site_that_does_not_answer_backs_off_and_does_not_hold_up_the_others() -> None:
    import asyncio

    from cloud_core.bus_nats import NatsIngestSettings
    from cloud_core.bus_nats_sites import LINK_BACKOFF_MAX_S, SourceResumer

    nc = _FakeHubAndLeaves({"up": {}})
    now = [100.0]
    r = SourceResumer(nc, NatsIngestSettings(urls=("tls://x:4222",), username="c",
                                             password="p", sites=("down", "up")),
                      clock=lambda: now[0])
    asyncio.run(r.poll())
    assert r.linked == {"up": 1} and r.link_failures == {"down": 1}
    assert _apis(nc.config) == ["$JS.other.API", "$JS.up.API"]
    tries = []
    for _ in range(100):  # 100 polls a second apart: tried at growing intervals, bounded
        now[0] += 1.0
        before = r.link_failures["down"]
        asyncio.run(r.poll())
        if r.link_failures["down"] > before:
            tries.append(now[0])
    gaps = [b - a for a, b in zip([100.0, *tries], tries, strict=False)]
    assert gaps == [1.0, 2.0, 4.0, 8.0, 16.0, LINK_BACKOFF_MAX_S, LINK_BACKOFF_MAX_S], gaps
    assert r.linked == {"up": 1}  # linked once: found in place on every poll since
    nc.leaves["down"] = {}  # the site answers
    now[0] += LINK_BACKOFF_MAX_S
    asyncio.run(r.poll())
    assert r.linked == {"up": 1, "down": 1} and "CFNET_EDGE" in nc.leaves["down"]
    assert _apis(nc.config) == ["$JS.other.API", "$JS.up.API", "$JS.down.API"]
    # A source removed from the hub stream (by hand, a re-created stream) is added back.
    nc.config["sources"] = [_src("$JS.other.API", 1), _src("$JS.down.API", 1)]
    now[0] += 1.0
    asyncio.run(r.poll())
    assert r.linked["up"] == 2 and "$JS.up.API" in _apis(nc.config)


def test_a_site_dropped_from_the_list_loses_only_the_source_the_core_added() -> None:
    """Restarted with a shorter --nats-sites, the core removes the sources it had added
    for the sites no longer named (CFNET_INGEST's metadata says which), counts them, and
    leaves a source added by hand (``other``) and every other config field as they were.
    (Against the real hub and leaf: tests/integration/test_bus_leaf_resume.py.)"""
    import asyncio

    from cloud_core.bus_nats import NatsIngestSettings
    from cloud_core.bus_nats_sites import SITES_META, SourceResumer

    nc = _FakeHubAndLeaves({"a": {}, "b": {}})
    nc.config["metadata"] = {"owner": "ops"}

    def core(sites: tuple[str, ...]) -> SourceResumer:
        return SourceResumer(nc, NatsIngestSettings(urls=("tls://x:4222",), username="c",
                                                    password="p", sites=sites))

    first = core(("a", "b"))
    asyncio.run(first.poll())
    assert _apis(nc.config) == ["$JS.other.API", "$JS.a.API", "$JS.b.API"]
    assert nc.config["metadata"] == {"owner": "ops", SITES_META: "a,b"}
    assert not first.removed
    again = core(("a",))  # restarted with b dropped
    asyncio.run(again.poll())
    assert _apis(nc.config) == ["$JS.other.API", "$JS.a.API"]
    assert nc.config["metadata"] == {"owner": "ops", SITES_META: "a"}
    assert again.removed == {"b": 1} and nc.config["max_age"] == 9
    nc.requests.clear()
    asyncio.run(again.poll())  # nothing more to do: no update
    assert "$JS.API.STREAM.UPDATE.CFNET_INGEST" not in nc.requests and again.removed == {"b": 1}
    none = core(())  # every site dropped: the hand-made source stays, the record goes
    asyncio.run(none.poll())
    assert _apis(nc.config) == ["$JS.other.API"] and none.removed == {"a": 1}
    assert nc.config["metadata"] == {"owner": "ops"}


def test_the_sites_record_is_bounded_and_bad_names_in_it_are_ignored() -> None:
    from cloud_core.bus_nats_sites import (
        MAX_SITE_LEN,
        MAX_SITES,
        SITES_META,
        claimed_sites,
        without_sites,
    )

    assert claimed_sites({"metadata": {SITES_META: "a,b-c,,ACK,x.y,B2"}}) == {"a", "B2"}
    assert claimed_sites({"metadata": {SITES_META: "a," * (MAX_SITES * MAX_SITE_LEN)}}) == set()
    assert claimed_sites({"metadata": "no"}) == set() and claimed_sites({}) == set()
    # An unclaimed source of a dropped name is not the core's: nothing to remove.
    assert without_sites({"sources": [_src("$JS.a.API", 1)]}, set()) is None
