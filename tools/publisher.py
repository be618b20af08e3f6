"""A minimal MQTT 5 QoS 1 publisher: the fleet simulator's load generator, not a device client.

Why not paho here: through ``edge_agent.wire.mqtt`` (paho, one network thread per
connection) the simulator spent about 140 µs of CPU per QoS 1 report, most
of it in paho's per-message bookkeeping and in threads trading the GIL. One
simulator process then topped out near 8,000 reports/s using a whole core
of the two this machine has, so a 10,000-node benchmark measured the load
generator instead of the core. Real agents send one report a second and keep
paho; the simulator speaks for thousands of nodes from one process and needs
a publisher that writes many PUBLISH packets per system call and reads the
acknowledgements in bulk (``tools/bench_ingest.py`` prints its cost).

What it does, and all it does: TCP (+TLS), CONNECT with username and
password, QoS 1 PUBLISH (optionally retained) pipelined up to the broker's
Receive Maximum, PUBACK accounting (a reason code of 0x80 or more counts as
refused), PINGREQ when idle, DISCONNECT. With ``settings.protocol == "mqtt311"`` (NATS's
MQTT listener) the same packets in MQTT 3.1.1 form: no properties, no Receive Maximum,
the client id without ``.``. No subscriptions, no reconnect: a
broken connection raises :class:`PublisherError` and the simulator reports
it. Single-threaded; the caller drives it with :meth:`publish`,
:meth:`flush` and :meth:`poll`.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import time

from edge_agent.wire.mqtt import MqttSettings, wire_client_id

# CONNACK reason codes a refusal is most likely to carry (MQTT 5, 3.2.2.2).
_REFUSALS = {0x84: "unsupported protocol version", 0x85: "client id not valid",
             0x86: "bad user name or password", 0x87: "not authorized",
             0x88: "server unavailable", 0x8A: "banned", 0x95: "packet too large"}
# Property identifier -> value kind, to skip over properties (MQTT 5, 2.2.2.2).
_PROP_KIND = {
    0x01: "b", 0x17: "b", 0x19: "b", 0x24: "b", 0x25: "b", 0x28: "b", 0x29: "b", 0x2A: "b",
    0x13: "h", 0x21: "h", 0x22: "h", 0x23: "h",
    0x02: "i", 0x11: "i", 0x18: "i", 0x27: "i",
    0x0B: "v",
    0x03: "s", 0x08: "s", 0x12: "s", 0x15: "s", 0x1A: "s", 0x1C: "s", 0x1F: "s",
    0x09: "s", 0x16: "s",  # binary data: the same length-prefixed layout
    0x26: "p",
}
_RECEIVE_MAXIMUM = 0x21
_FLUSH_BYTES = 64 * 1024


class PublisherError(RuntimeError):
    """The connection was refused, broke, or the broker sent something unexpected."""


def varint(n: int) -> bytes:
    """MQTT's variable byte integer (the remaining length of a packet)."""
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(buf: bytes | bytearray, i: int) -> tuple[int, int] | None:
    """(value, next index), or None when ``buf`` ends inside the integer."""
    value, shift = 0, 0
    for k in range(4):
        if i + k >= len(buf):
            return None
        b = buf[i + k]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i + k + 1
        shift += 7
    raise PublisherError("malformed remaining length")


def next_packet(buf: bytes | bytearray, i: int) -> tuple[int, int, int] | None:
    """(packet type, body start, body end) of the packet at ``buf[i]``; None if incomplete."""
    if i + 2 > len(buf):
        return None
    got = _read_varint(buf, i + 1)
    if got is None or got[1] + got[0] > len(buf):
        return None
    n, start = got
    return buf[i] & 0xF0, start, start + n


def utf8_field(s: str) -> bytes:
    """A length-prefixed UTF-8 string, as MQTT writes them."""
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def connect_packet(client_id: str, username: str | None, password: str | None,
                   keepalive_s: int, clean_start: bool, session_expiry_s: int,
                   version: int = 5) -> bytes:
    """CONNECT, MQTT 5 (``version=5``) or 3.1.1 (``version=4``: no properties)."""
    flags = (0x02 if clean_start else 0) | (0x80 if username is not None else 0) \
        | (0x40 if password is not None else 0)
    props = b"\x11" + struct.pack("!I", session_expiry_s) if session_expiry_s else b""
    head = varint(len(props)) + props if version == 5 else b""
    body = utf8_field("MQTT") + bytes([version, flags]) + struct.pack("!H", keepalive_s) \
        + head + utf8_field(client_id)
    if username is not None:
        body += utf8_field(username)
    if password is not None:
        body += utf8_field(password)
    return b"\x10" + varint(len(body)) + body


def publish_packet(topic: bytes, payload: bytes, packet_id: int, retain: bool,
                   v5: bool = True) -> bytes:
    """QoS 1 PUBLISH with no properties (MQTT 5: an empty property block; 3.1.1: none)."""
    ident = struct.pack("!HB", packet_id, 0) if v5 else struct.pack("!H", packet_id)
    rest = len(topic) + 2 + len(ident) + len(payload)
    return b"".join((bytes([0x32 | retain]), varint(rest), struct.pack("!H", len(topic)), topic,
                     ident, payload))


def parse_properties(data: bytes | bytearray) -> dict[int, int]:
    """The integer-valued properties of one property block (strings are skipped)."""
    out: dict[int, int] = {}
    i = 0
    while i < len(data):
        pid = data[i]
        i += 1
        kind = _PROP_KIND.get(pid)
        if kind is None:
            raise PublisherError(f"unknown property 0x{pid:02x}")
        if kind == "b":
            out[pid] = data[i]
            i += 1
        elif kind == "h":
            out[pid] = struct.unpack_from("!H", data, i)[0]
            i += 2
        elif kind == "i":
            out[pid] = struct.unpack_from("!I", data, i)[0]
            i += 4
        elif kind == "v":
            got = _read_varint(data, i)
            if got is None:
                raise PublisherError("truncated property")
            out[pid], i = got
        else:
            for _ in range(2 if kind == "p" else 1):
                i += 2 + struct.unpack_from("!H", data, i)[0]
    return out


class Publisher:
    """One MQTT 5 (or 3.1.1, for NATS) connection that publishes QoS 1 messages, pipelined."""

    def __init__(self, settings: MqttSettings) -> None:
        self.settings = settings
        self.sent = 0
        self.acked = 0
        self.refused = 0
        self.receive_maximum = 65535
        self._sock: socket.socket | None = None
        self._out = bytearray()
        self._in = bytearray()
        self._next_id = 1
        self._last_send = time.monotonic()
        self._v5 = settings.protocol == "mqtt5"

    @property
    def in_flight(self) -> int:
        return self.sent - self.acked - self.refused

    # ------------------------------------------------------------------ lifecycle

    def connect(self, timeout_s: float = 10.0) -> None:
        s = self.settings
        try:
            raw = socket.create_connection((s.host, s.port), timeout=timeout_s)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock: socket.socket = raw
            if s.tls:
                ctx = ssl.create_default_context(cafile=str(s.ca_file) if s.ca_file else None)
                if s.certfile and s.keyfile:
                    ctx.load_cert_chain(str(s.certfile), str(s.keyfile))
                sock = ctx.wrap_socket(raw, server_hostname=s.host)
            cid = wire_client_id(s.client_id or s.username or "", s.protocol)
            sock.sendall(connect_packet(cid, s.username, s.password, s.keepalive_s,
                                        s.clean_start, s.session_expiry_s,
                                        5 if self._v5 else 4))
            self._sock = sock
            ptype, body = self._read_packet(time.monotonic() + timeout_s)
        except OSError as exc:
            self.close()
            raise PublisherError(f"cannot connect to {s.host}:{s.port}: {exc}") from exc
        if ptype != 0x20 or len(body) < 2:
            self.close()
            raise PublisherError(f"expected CONNACK, got packet type 0x{ptype:02x}")
        if body[1] != 0:
            self.close()
            raise PublisherError(
                f"connection refused: {_REFUSALS.get(body[1], f'reason 0x{body[1]:02x}')}")
        got = _read_varint(body, 2) if self._v5 else None
        if got is not None:
            n, i = got
            props = parse_properties(body[i:i + n])
            self.receive_maximum = props.get(_RECEIVE_MAXIMUM, 65535)
        sock.settimeout(timeout_s)

    def close(self) -> None:
        if self._sock is None:
            return
        with contextlib.suppress(OSError):  # closing anyway
            self._sock.sendall(bytes(self._out) + b"\xe0\x00")
        self._out.clear()
        self._sock.close()
        self._sock = None

    # ------------------------------------------------------------------ publishing

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Queue one QoS 1 message; waits (polling acks) while the window is full."""
        if self._sock is None:
            raise PublisherError("not connected")
        while self.in_flight >= self.receive_maximum:
            self.flush()
            self.poll(0.05)
        pid = self._next_id
        self._next_id = pid % 65535 + 1
        self._out += publish_packet(topic.encode(), payload, pid, retain, self._v5)
        self.sent += 1
        if len(self._out) >= _FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self._sock is None or not self._out:
            return
        try:
            self._sock.sendall(self._out)
        except OSError as exc:
            raise PublisherError(f"send failed: {exc}") from exc
        self._out.clear()
        self._last_send = time.monotonic()

    def poll(self, timeout_s: float = 0.0) -> None:
        """Read whatever acknowledgements have arrived (waiting up to ``timeout_s``)."""
        sock = self._sock
        if sock is None:
            return
        if time.monotonic() - self._last_send > self.settings.keepalive_s / 2:
            self._out += b"\xc0\x00"  # PINGREQ
            self.flush()
        pending = sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
        if not pending and not select.select([sock], [], [], timeout_s)[0]:
            return
        try:
            data = sock.recv(65536)
        except (ssl.SSLWantReadError, BlockingIOError):
            return
        except OSError as exc:
            raise PublisherError(f"receive failed: {exc}") from exc
        if not data:
            raise PublisherError("the broker closed the connection")
        self._in += data
        self._consume()

    def drain(self, timeout_s: float) -> bool:
        """Flush and wait until every message is acknowledged; False on timeout."""
        deadline = time.monotonic() + timeout_s
        self.flush()
        while self.in_flight > 0 and time.monotonic() < deadline:
            self.poll(min(0.05, max(0.0, deadline - time.monotonic())))
        return self.in_flight == 0

    # ------------------------------------------------------------------ reading

    def _consume(self) -> None:
        buf, i = self._in, 0
        while (frame := next_packet(buf, i)) is not None:
            ptype, start, end = frame
            if ptype == 0x40:  # PUBACK: packet id, then a reason code if not success
                if end - start >= 3 and buf[start + 2] >= 0x80:
                    self.refused += 1
                else:
                    self.acked += 1
            elif ptype == 0xE0:
                reason = buf[start] if end > start else 0
                raise PublisherError(f"the broker disconnected us (reason 0x{reason:02x})")
            elif ptype != 0xD0:  # PINGRESP needs nothing
                raise PublisherError(f"unexpected packet type 0x{ptype:02x}")
            i = end
        del buf[:i]

    def _read_packet(self, deadline: float) -> tuple[int, bytes]:
        """One whole packet, blocking (used only for CONNACK)."""
        assert self._sock is not None
        while (frame := next_packet(self._in, 0)) is None:
            if time.monotonic() > deadline:
                raise PublisherError("timed out waiting for the broker")
            data = self._sock.recv(65536)
            if not data:
                raise PublisherError("the broker closed the connection")
            self._in += data
        ptype, start, end = frame
        body = bytes(self._in[start:end])
        del self._in[:end]
        return ptype, body
