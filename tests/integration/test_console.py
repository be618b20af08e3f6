"""cfnetctl, the real CLI as a subprocess, against a live core on a real Mosquitto:
every command with its output checked, roles, privacy of responses, behaviour with
the core or broker down, and the map drawn in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from cloud_core.service import CoreService
from edge_agent.wire import response_topic
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import MqttClient
from tests.integration.helpers import FakeAgent, settings, wait_for
from tools.broker import Broker

CTL = str(Path(sys.executable).parent / "cfnetctl")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

WORKLOADS = """
name: web
requests: {cpu: 500m}
residency: eu
---
name: vault
requests: {cpu: 250m}
minSecurityLevel: 3
---
name: huge
requests: {cpu: "64"}
residency: eu
"""


def ctl(
    broker: Broker, user: str, *args: str, timeout: float = 5.0
) -> subprocess.CompletedProcess[str]:
    creds = broker.add_account(user, "operator")
    env = {**os.environ, "CFNET_BROKER_HOST": broker.host, "CFNET_BROKER_PORT": str(broker.port),
           "CFNET_USER": user, "CFNET_PASSWORD": creds.password,
           "CFNET_CA_FILE": str(broker.ca_file), "COLUMNS": "80"}
    return subprocess.run([CTL, "--timeout", str(timeout), *args], env=env, capture_output=True,
                          text=True, timeout=timeout + 30)


def rows_of(text: str, label: str) -> list[str]:
    """The cells after ``label`` on the table line that starts with it."""
    (line,) = [ln for ln in text.splitlines() if ln.startswith(label + " ")]
    return line[len(label):].split()


def fits_80(text: str) -> bool:
    return all(len(line) <= 80 for line in text.splitlines())


@pytest.fixture
def ready(broker: Broker, core: CoreService, agents: dict[str, FakeAgent]) -> CoreService:
    wait_for(lambda: all(n.status == "online" and n.reports > 0
                         for n in core.state.snapshot(time.time()).nodes.values())
             and len(core.state.snapshot(time.time()).nodes) == 3, what="3 nodes reporting")
    return core


def test_read_commands(broker: Broker, ready: CoreService, tmp_path: Path) -> None:
    r = ctl(broker, "alice", "nodes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[:3] == ["NODE", "HEALTH", "REGION"]
    for n in ("edge-a", "edge-b", "edge-c"):
        assert n in r.stdout
    assert "online" in r.stdout and fits_80(r.stdout)
    r = ctl(broker, "alice", "links")
    assert r.returncode == 0 and "edge-a" in r.stdout and "ms" in r.stdout and fits_80(r.stdout)
    r = ctl(broker, "alice", "links", "edge-c")
    assert r.returncode == 0
    assert all("edge-c" in line for line in r.stdout.splitlines()[1:])
    r = ctl(broker, "alice", "links", "edge-zz")
    assert r.returncode == 1 and "no node 'edge-zz'" in r.stderr
    r = ctl(broker, "alice", "-o", "json", "nodes")
    assert {n["node"] for n in json.loads(r.stdout)} == {"edge-a", "edge-b", "edge-c"}
    r = ctl(broker, "alice", "-o", "yaml", "stats")
    assert yaml.safe_load(r.stdout)["accepted"] > 0


def test_write_commands_and_explain(broker: Broker, ready: CoreService, tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(WORKLOADS)
    r = ctl(broker, "alice", "submit", "-f", str(f))
    assert r.returncode == 0, r.stderr
    assert "default/web" in r.stdout and "submitted" in r.stdout
    wait_for(lambda: sorted(w.state for w in ready.store.workloads())
             == ["placed", "placed", "unplaceable"], what="placed")
    r = ctl(broker, "alice", "workloads")
    assert r.returncode == 0 and "placed" in r.stdout and fits_80(r.stdout)
    r = ctl(broker, "alice", "placements")
    assert "default/vault" in r.stdout and "edge-c" in r.stdout
    # explain shows what the engine knows: the fit summary, the runner-up and the
    # cost difference term by term, or per-reason counts with example nodes.
    r = ctl(broker, "alice", "explain", "vault")
    assert r.returncode == 0 and fits_80(r.stdout), r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "node      edge-c" in lines and "fit       1/3 nodes fit: 2 security level < 3" in lines
    assert "runner-up none: no other node fits" in lines
    assert rows_of(r.stdout, "security level < 3") == ["2", "edge-a,", "edge-b"]
    r = ctl(broker, "alice", "explain", "web")  # eu: edge-b (0.05 $/h) over edge-a (0.10)
    assert r.returncode == 0 and fits_80(r.stdout), r.stdout + r.stderr
    print("\n$ cfnetctl explain web\n" + r.stdout)  # the README quotes this run
    assert "node      edge-b" in r.stdout.splitlines()
    assert "runner-up edge-a (+0." in r.stdout
    chosen, runner, diff = (float(x) for x in rows_of(r.stdout, "price"))
    assert runner > chosen > 0 and abs(runner - chosen - diff) < 2e-5
    t_chosen, t_runner, t_diff = (float(x) for x in rows_of(r.stdout, "total"))
    assert t_diff > 0 and abs(t_runner - t_chosen - t_diff) < 2e-5
    assert rows_of(r.stdout, "residency") == ["1", "edge-c"]
    # how good the placement is: the gap of the batch that placed it, as its own line
    assert re.search(r"^batch     within \d+\.\d % of the best possible for its batch of "
                     r"\d+ pods", r.stdout, re.M), r.stdout
    r = ctl(broker, "alice", "explain", "huge")  # 64 CPUs, eu: nowhere
    assert r.returncode == 0 and fits_80(r.stdout), r.stdout + r.stderr
    print("\n$ cfnetctl explain huge\n" + r.stdout)
    assert "state     unplaceable" in r.stdout and "runner-up" not in r.stdout
    assert rows_of(r.stdout, "insufficient cpu") == ["2", "edge-a,", "edge-b"]
    assert rows_of(r.stdout, "residency") == ["1", "edge-c"]
    # the minimal conflict and the nearest change, checked by the validator
    assert "conflict  each fails on every node alone: cpu 64" in r.stdout
    (tip,) = [ln for ln in r.stdout.splitlines() if ln.startswith("would fit")]
    assert "cpu 64 -> " in tip and ("edge-a fits" in tip or "edge-b fits" in tip), tip
    # two constraints that each admit a node but not together: each one's nearest change,
    # the latency one with the link behind it (docs/console.md quotes this run)
    sf = tmp_path / "secret.yaml"
    sf.write_text("name: secret\nrequests: {cpu: 100m}\nminSecurityLevel: 3\n"
                  "maxLatencyMs: 20\nlatencyTo: edge-a\n---\n"
                  "name: near\nrequests: {cpu: 100m}\nmaxLatencyMs: 20\nlatencyTo: edge-a\n"
                  "nodeSelector: {kubernetes.io/hostname: edge-b}\n")
    assert ctl(broker, "alice", "submit", "-f", str(sf)).returncode == 0
    wait_for(lambda: any(w.state == "unplaceable" and w.name == "secret"
                         for w in ready.store.workloads()), what="secret unplaceable")
    r = ctl(broker, "alice", "explain", "secret")
    assert r.returncode == 0 and fits_80(r.stdout), r.stdout + r.stderr
    print("\n$ cfnetctl explain secret\n" + r.stdout)
    flat = " ".join(r.stdout.split())  # long lines are wrapped to 80 columns
    assert "max latency 20 ms to edge-a + security level 3" in flat
    assert re.search(r"would fit max latency 20 ms -> (\d+) ms: edge-c fits \(p95 [\d.]+ ms, "
                     r"\d+ samples, \d+ s old\)", flat), flat
    assert "security level 3 -> 2: edge-a fits" in flat
    # the same answer as an event, off the loop's path, and the metric's tally (local mode)
    said = wait_for(lambda: [e.message for e in ready.events.recent(200, kind="conflict")
                             if "default/secret" in e.message or "secret" in e.message],
                    what="secret's conflict event")
    assert ". cfnet: max latency 20 ms to edge-a + security level 3 admit no node; would " \
        "fit: max latency 20 ms -> " in said[-1], said
    print("\nconflict event: " + said[-1])  # docs/console.md quotes this run
    assert ready.scheduler.conflicts is not None
    counts = ready.scheduler.conflicts.counts()
    assert counts.get("latency") == 1 and counts.get("security") == 1, counts
    assert counts.get("cpu") == 1  # huge: cpu 64 fails on every node
    wait_for(lambda: any(w.state == "placed" and w.name == "near"
                         for w in ready.store.workloads()), what="near placed")
    r = ctl(broker, "alice", "explain", "near")  # placed: the link its SLA rests on
    assert r.returncode == 0 and fits_80(r.stdout), r.stdout + r.stderr
    print("\n$ cfnetctl explain near\n" + r.stdout)
    assert re.search(r"^link      edge-b -> edge-a: p95 [\d.]+ ms, \d+ samples, \d+ s old$",
                     r.stdout, re.M), r.stdout
    r = ctl(broker, "alice", "-o", "json", "explain", "near")
    doc = json.loads(r.stdout)
    assert doc["batch"]["pods"] >= 1 and 0.0 <= doc["batch"]["gap"] < 1.0, doc
    assert doc["batch"]["cost"] >= doc["batch"]["bound"] - 1e-9, doc
    assert doc["link_figures"]["samples"] > 0 and doc["link_figures"]["age_s"] >= 0, doc
    r = ctl(broker, "alice", "explain", "nope")
    assert r.returncode == 1 and "no workload 'nope'" in r.stderr
    # what-if: an answer, and nothing changed.
    before = (ready.store.workloads(), ready.store.journal())
    wf = tmp_path / "wi.yaml"
    wf.write_text("name: probe\nrequests: {cpu: 100m}\nresidency: us\n")
    r = ctl(broker, "alice", "what-if", "-f", str(wf))
    assert r.returncode == 0 and "edge-c" in r.stdout and "nothing was changed" in r.stdout
    assert (ready.store.workloads(), ready.store.journal()) == before
    r = ctl(broker, "alice", "cordon", "edge-b")
    assert r.returncode == 0 and "cordoned" in r.stdout
    r = ctl(broker, "alice", "uncordon", "edge-b")
    assert r.returncode == 0 and "uncordoned" in r.stdout
    r = ctl(broker, "alice", "delete", "web")
    assert r.returncode == 0 and "deleted default/web" in r.stdout
    r = ctl(broker, "alice", "events", "--limit", "50")
    assert r.returncode == 0 and "default/vault" in r.stdout and fits_80(r.stdout)
    # Bad input gets a clear error, not a traceback.
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nrequests: {cpu: lots}\n")
    r = ctl(broker, "alice", "submit", "-f", str(bad))
    assert r.returncode == 1 and "requests.cpu" in r.stderr and "Traceback" not in r.stderr
    r = ctl(broker, "alice", "submit", "-f", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_received_shows_seqs_per_boot(broker: Broker, ready: CoreService) -> None:
    """`cfnetctl received NODE`: the core's folded-in seqs per boot, gaps and all, as a
    table. A node of its own (not the fixture's beating agents) so the seqs are known."""
    # No announce: a retained status would outlive this test on the module's broker,
    # and the next tests' cores would see a fourth node. Telemetry alone is enough.
    ag = FakeAgent(broker, broker.add_account("edge-r", "agent"), "10.9.0.9")
    try:
        first = ag.boot
        for _ in range(5):
            ag.report()  # 1..5
        ag.seq = 8
        for _ in range(2):
            ag.report()  # 9, 10: 6-8 never sent
        ag.seq = 2
        ag.report()  # seq 3 again: a duplicate the core drops, not folded in twice
        ag.boot, ag.seq = "feedc0de", 0  # the agent restarted
        for _ in range(3):
            ag.report()
        wait_for(lambda: len(ready.state.node_history("edge-r")) == 10, what="10 folded in")
        r = ctl(broker, "victor", "received", "edge-r")  # a viewer may read it
        assert r.returncode == 0 and fits_80(r.stdout), r.stdout + r.stderr
        print("\n$ cfnetctl received edge-r\n" + r.stdout)
        lines = r.stdout.splitlines()
        assert lines[0] == ("node edge-r: 10 reports folded in from 2 boots since this core "
                            "started")
        assert lines[1].split() == ["BOOT", "REPORTS", "DISTINCT", "MISSING", "SEQS"]
        assert rows_of(r.stdout, first) == ["7", "7", "3", "1-5,", "9-10"]
        assert rows_of(r.stdout, "feedc0de") == ["3", "3", "0", "1-3"]
        r = ctl(broker, "victor", "-o", "json", "received", "edge-r")
        data = json.loads(r.stdout)
        assert [(b["boot"], b["seqs"]) for b in data["boots"]] == [
            (first, [[1, 5], [9, 10]]), ("feedc0de", [[1, 3]])]
        r = ctl(broker, "victor", "received", "edge-zz")
        assert r.returncode == 1 and "no node 'edge-zz'" in r.stderr
        r = ctl(broker, "victor", "received", "edge-\x1b[2J")  # never echoed raw
        assert r.returncode == 1 and "no node" in r.stderr, r.stderr
        assert "\x1b" not in r.stderr
    finally:
        ag.close()


def test_workloads_paged_and_says_when_cut(broker: Broker, ready: CoreService,
                                          tmp_path: Path) -> None:
    """`cfnetctl workloads --limit N --offset K`: a page, and a last line saying the
    list was cut; the default page is 100."""
    f = tmp_path / "many.yaml"
    f.write_text("name: many\nreplicas: 230\nrequests: {cpu: 1m}\nresidency: mars\n")
    r = ctl(broker, "alice", "submit", "-f", str(f), timeout=15)
    assert r.returncode == 0, r.stderr
    uids = [w.uid for w in ready.store.workloads()]
    assert len(uids) == 230

    def listed(out: str) -> list[str]:
        return [ln.split()[0] for ln in out.splitlines()[1:] if ln.startswith("default/")]

    r = ctl(broker, "victor", "workloads")
    assert r.returncode == 0 and fits_80(r.stdout), r.stdout + r.stderr
    assert len(listed(r.stdout)) == 100
    assert r.stdout.splitlines()[-1].startswith("showing 1-100 of 230 "), r.stdout[-300:]
    r = ctl(broker, "victor", "workloads", "--offset", "200", "--limit", "50")
    assert len(listed(r.stdout)) == 30
    assert r.stdout.splitlines()[-1].startswith("showing 201-230 of 230 ")
    r = ctl(broker, "victor", "-o", "json", "workloads", "--offset", "100", "--limit", "100")
    page = json.loads(r.stdout)
    assert (page["total"], page["offset"]) == (230, 100)
    assert [w["uid"] for w in page["items"]] == uids[100:200]  # the store's order, no overlap
    r = ctl(broker, "victor", "workloads", "--limit", "1000")
    assert len(listed(r.stdout)) == 230 and "showing" not in r.stdout  # nothing cut
    r = ctl(broker, "victor", "workloads", "--offset", "500")
    assert r.returncode == 0 and "none from 501: there are 230" in r.stdout
    for bad in (["--limit", "0"], ["--offset", "-1"], ["--limit", "x"]):
        r = ctl(broker, "victor", "workloads", *bad)
        assert r.returncode == 2 and "workloads: error: argument" in r.stderr, (bad, r.stderr)


def test_viewer_drain_refused_and_audited(broker: Broker, ready: CoreService) -> None:
    r = ctl(broker, "victor", "drain", "edge-a")
    assert r.returncode == 1
    assert "permission denied" in r.stderr and "needs role 'operator'" in r.stderr
    r = ctl(broker, "alice", "drain", "edge-a")
    assert r.returncode == 0 and "cordoned" in r.stdout
    audit = ready.store.audit_log()
    assert any(a["operator"] == "victor" and a["cmd"] == "drain"
               and a["result"].startswith("error: permission denied") for a in audit)
    assert any(a["operator"] == "alice" and a["cmd"] == "drain" and a["result"] == "ok"
               for a in audit)
    r = ctl(broker, "root", "audit")
    assert r.returncode == 0 and "victor" in r.stdout and "drain" in r.stdout
    r = ctl(broker, "alice", "audit")
    assert r.returncode == 1 and "needs role 'admin'" in r.stderr


def test_operator_cannot_read_anothers_responses(broker: Broker, ready: CoreService) -> None:
    seen: list[Message] = []
    bob = broker.add_account("bob", "operator")
    spy = MqttClient(settings(broker, bob), on_message=seen.append)
    spy.subscribe(response_topic("alice"))
    spy.subscribe("cfnet/v1/console/+/response")
    spy.start()
    assert spy.wait_connected(10)
    time.sleep(0.5)  # let the (granted-but-useless) subscriptions settle
    r = ctl(broker, "alice", "nodes")
    assert r.returncode == 0
    time.sleep(1.0)
    spy.stop()
    assert [m.topic for m in seen] == []


def test_events_follow_and_top(broker: Broker, ready: CoreService) -> None:
    creds = broker.add_account("alice", "operator")
    env = {**os.environ, "CFNET_BROKER_HOST": broker.host, "CFNET_BROKER_PORT": str(broker.port),
           "CFNET_USER": "alice", "CFNET_PASSWORD": creds.password,
           "CFNET_CA_FILE": str(broker.ca_file)}
    follower = subprocess.Popen([CTL, "events", "--follow", "--for", "6"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    r = ctl(broker, "carol", "cordon", "edge-c")  # carol's own account: not to kick alice off
    assert r.returncode == 0, r.stderr
    out, err = follower.communicate(timeout=30)
    assert "cordoned edge-c" in out, out + err
    r = ctl(broker, "carol", "top", "--iterations", "1")
    assert r.returncode == 0 and "cfnet top" in r.stdout and "SLOWEST LINKS" in r.stdout


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="chromium not installed (tools/setup.sh installs it)")
def test_map_drawn_in_headless_chromium(broker: Broker, ready: CoreService, tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(WORKLOADS)
    assert ctl(broker, "alice", "submit", "-f", str(f)).returncode == 0
    wait_for(lambda: sorted(w.state for w in ready.store.workloads())
             == ["placed", "placed", "unplaceable"], what="placed")
    out = tmp_path / "map.html"
    r = ctl(broker, "alice", "map", "--out", str(out))
    assert r.returncode == 0 and "3 nodes" in r.stdout, r.stderr
    page = out.read_text()
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # offline
    profile = tmp_path / f"chrome-{uuid.uuid4().hex[:6]}"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", out.as_uri()], capture_output=True,
                         text=True, timeout=90)
    assert dom.returncode == 0, dom.stderr[-2000:]
    start = dom.stdout.index("data-drawn=") + len("data-drawn=") + 1
    quote = dom.stdout[start - 1]
    drawn = json.loads(dom.stdout[start:dom.stdout.index(quote, start)].replace("&quot;", '"'))
    assert drawn["nodes"] == 3 and drawn["nodes_inside"] == 3
    assert drawn["links"] == 3  # three undirected pairs among three nodes
    assert drawn["workloads"] == 2
    # edge-a <-> edge-b measure 5 ms (amber), the pairs with edge-c 80 ms (red).
    assert drawn["link_colours"] == {"rgb(251, 140, 0)": 1, "rgb(229, 57, 53)": 2}
    png = tmp_path / "map.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={png}", "--window-size=900,600",
                    out.as_uri()], capture_output=True, timeout=90)
    assert png.exists() and png.stat().st_size > 5000


def test_core_down_fails_fast_with_advice(broker_factory: object, tmp_path: Path) -> None:
    b: Broker = broker_factory()  # type: ignore[operator]
    for cmd in (["nodes"], ["links"], ["workloads"], ["placements"], ["explain", "x"],
                ["cordon", "edge-a"], ["drain", "edge-a"], ["events"], ["stats"]):
        # ctl() bounds the run (subprocess timeout): a hang fails the test.
        r = ctl(b, "alice", *cmd, timeout=2)
        assert r.returncode == 3, (cmd, r.stdout, r.stderr)
        assert "did not answer" in r.stderr and "cfnet-core is running" in r.stderr
    b.stop()
    r = ctl(b, "alice", "nodes", timeout=2)
    assert r.returncode == 3 and "no answer from broker" in r.stderr
    assert "host and port" in r.stderr
