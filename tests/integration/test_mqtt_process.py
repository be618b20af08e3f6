"""The core's MQTT connection in a child process (cloud_core.mqtt_process), on the real broker.

Messages must reach the core in broker order with their MQTT 5 properties,
publishes must be acknowledged through the child, refusals must be visible,
and the child must never outlive the core: not after ``stop``, not after the
core is SIGKILLed (it would hold the account's session). The whole core runs
on it too: reports folded into state, a console request answered.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud_core.console.client import ConsoleClient
from cloud_core.mqtt_process import MqttProcess
from cloud_core.service import CoreConfig, CoreService
from edge_agent.wire import EVENTS_TOPIC, TELEMETRY_WILDCARD, telemetry_topic
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import MqttClient
from tests.integration.helpers import FakeAgent, settings, wait_for
from tools.broker import Broker

REPO = Path(__file__).resolve().parents[2]


class Inbox:
    def __init__(self) -> None:
        self.got: list[Message] = []
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, m: Message) -> None:
        with self._lock:
            self.got.append(m)
            self.threads.add(threading.current_thread().name)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def sender(broker: Broker) -> Iterator[MqttClient]:
    c = MqttClient(settings(broker, broker.add_account("sim-mp-sender", "sim"),
                            client_id="sim-mp-sender"))
    c.start()
    assert c.wait_connected(10)
    yield c
    c.stop()


def test_messages_arrive_in_order_with_properties_and_publishes_are_acked(
        broker: Broker, sender: MqttClient) -> None:
    inbox = Inbox()
    mp = MqttProcess(settings(broker, broker.add_account("core-mp1", "core"),
                              client_id="core-mp1"), on_message=inbox)
    mp.subscribe(TELEMETRY_WILDCARD, qos=1)
    mp.start()
    try:
        assert mp.wait_connected(20), mp.last_refusal
        wait_for(lambda: sender.publish(telemetry_topic("mp-probe"), b"-1").wait(5) and any(
            m.payload == b"-1" for m in inbox.got), what="the subscription to take effect")
        n = 2000  # several batches
        for i in range(n):
            sender.publish(telemetry_topic("mp-a"), b"%d" % i, qos=1)
        h = sender.publish(telemetry_topic("mp-b"), b"props", qos=1,
                           response_topic="cfnet/v1/console/x/response", correlation_data=b"c1")
        assert h.wait(10)
        wait_for(lambda: sum(m.topic == telemetry_topic("mp-a") for m in inbox.got) >= n,
                 what="every message through the child")
        got = [int(m.payload) for m in inbox.got if m.topic == telemetry_topic("mp-a")]
        assert got == list(range(n))
        props = next(m for m in wait_for(lambda: [
            m for m in inbox.got if m.payload == b"props"], what="the message with properties"))
        assert (props.response_topic, props.correlation_data, props.qos) == (
            "cfnet/v1/console/x/response", b"c1", 1)
        assert inbox.threads == {"cfnet-mqtt-reader"}  # one thread: handlers see order
        # publishing through the child: QoS 1 is acknowledged, QoS 0 resolves at once
        echo = Inbox()
        sender.stop()
        listener = MqttClient(settings(broker, broker.add_account("mp-listen", "operator"),
                                       client_id="mp-listen"), on_message=echo)
        listener.subscribe(EVENTS_TOPIC, qos=1)
        listener.start()
        assert listener.wait_connected(10)
        try:
            wait_for(lambda: mp.publish(EVENTS_TOPIC, b"x").wait(5) and echo.got,
                     what="a publish through the child to arrive")
            assert mp.publish(EVENTS_TOPIC, b"q0", qos=0).done()
        finally:
            listener.stop()
    finally:
        mp.stop()
    assert not mp.connected
    assert mp.pid is None
    # a stopped connection cannot publish; the handle says so instead of hanging
    assert not mp.publish(EVENTS_TOPIC, b"late").wait(1)


def test_a_refused_connection_is_reported(broker: Broker) -> None:
    s = settings(broker, broker.add_account("core-mp2", "core"), client_id="core-mp2")
    mp = MqttProcess(dataclasses.replace(s, password="wrong"))
    mp.start()
    try:
        wait_for(lambda: mp.last_refusal, timeout_s=20, what="the refusal to reach the core")
        assert not mp.connected
    finally:
        mp.stop()


CHILD_OF_A_CORE = """
import sys, time
from pathlib import Path
from cloud_core.mqtt_process import MqttProcess
from edge_agent.wire.mqtt import MqttSettings
mp = MqttProcess(MqttSettings(host=sys.argv[1], port=int(sys.argv[2]), username=sys.argv[3],
                              password=sys.argv[4], ca_file=Path(sys.argv[5]),
                              client_id=sys.argv[3]))
mp.start()
print(mp.pid, flush=True)
mp.wait_connected(20)
print("connected" if mp.connected else "not connected", flush=True)
time.sleep(120)
"""


def test_the_child_exits_when_the_core_is_killed(broker: Broker) -> None:
    creds = broker.add_account("core-mp3", "core")
    core = subprocess.Popen(
        [sys.executable, "-c", CHILD_OF_A_CORE, broker.host, str(broker.port), creds.username,
         creds.password or "", str(creds.ca_file)],
        cwd=str(REPO), stdout=subprocess.PIPE, text=True)
    try:
        assert core.stdout is not None
        child = int(core.stdout.readline())
        assert core.stdout.readline().strip() == "connected"
        assert pid_alive(child)
        core.send_signal(signal.SIGKILL)
        core.wait(10)
        wait_for(lambda: not pid_alive(child), timeout_s=20, what="the orphaned child to exit")
    finally:
        if core.poll() is None:
            core.kill()


def test_a_core_on_the_child_process_ingests_and_answers(broker: Broker, tmp_path: Path) -> None:
    creds = broker.add_account("core-mp4", "core")
    core = CoreService(CoreConfig(mqtt=settings(broker, creds, client_id="core-mp4"),
                                  db_path=tmp_path / "core.db", roles={"olga": "viewer"},
                                  mqtt_process=True, step_interval_s=0.2))
    core.start()
    agent = FakeAgent(broker, broker.add_account("edge-mp", "agent"), "10.77.0.1")
    try:
        assert core.mqtt.wait_connected(20), core.mqtt.last_refusal
        agent.announce()
        for _ in range(5):
            agent.report()
        wait_for(lambda: core.ingest.counters().accepted >= 5, what="reports in state")
        assert core.state.snapshot(0).nodes["edge-mp"].seq == 5
        op = broker.add_account("olga", "operator")
        with ConsoleClient(settings(broker, op, client_id="olga"), "olga") as cc:
            resp = cc.call("nodes", {})
        assert resp.ok and "edge-mp" in str(resp.data)
    finally:
        agent.client.stop()
        core.stop()
