"""Console request/response messages (JSON), shared by `cfnetctl` and the core.

A request is ``{"cmd": str, "args": {...}}`` published to the operator's own
request topic with an MQTT 5 response topic and correlation data; the reply is
``{"ok": bool, "data": ..., "error": str}`` on that response topic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from edge_agent.wire import MAX_PAYLOAD_BYTES, WireError, load_json

# The wire's payload cap (the broker's max_packet_size is this plus 16 KiB of topic and
# properties): anything the broker delivers is answered, a 900-document what-if included.
MAX_REQUEST_BYTES = MAX_PAYLOAD_BYTES
MAX_CMD_LEN = 64


@dataclass(frozen=True, slots=True)
class Request:
    cmd: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Response:
    ok: bool
    data: Any = None
    error: str = ""


def encode_request(req: Request) -> bytes:
    return json.dumps({"cmd": req.cmd, "args": req.args}).encode()


def parse_request(payload: bytes) -> Request:
    """Bounded first: size, then JSON with bounded numbers and depth (``load_json``), then
    shape. Every refusal is a ``WireError`` whose detail is meant for the operator."""
    if len(payload) > MAX_REQUEST_BYTES:
        raise WireError("oversized",
                        f"request of {len(payload)} bytes (at most {MAX_REQUEST_BYTES})")
    raw = load_json(payload)
    if not isinstance(raw, dict) or not isinstance(raw.get("cmd"), str):
        raise WireError("schema", "request must be an object with a string 'cmd'")
    cmd = raw["cmd"]
    if len(cmd) > MAX_CMD_LEN or not cmd.isprintable():
        raise WireError("schema", f"'cmd' must be at most {MAX_CMD_LEN} printable characters")
    args = raw.get("args")
    args = {} if args is None else args
    if not isinstance(args, dict):
        raise WireError("schema", "'args' must be an object")
    return Request(cmd=cmd, args=args)


def _default(o: Any) -> Any:
    # Only called for what json can't encode; floats never get here.
    if isinstance(o, set | tuple):
        return list(o)
    return str(o)


def _finite(o: Any) -> Any:
    if isinstance(o, float):
        return o if o == o and o not in (float("inf"), float("-inf")) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_finite(v) for v in o]
    return o


# A response must fit the wire's payload cap, or the broker cuts the core off.
MAX_RESPONSE_BYTES = MAX_PAYLOAD_BYTES - 1024


def encode_response(resp: Response) -> bytes:
    """The reply as JSON; one that would exceed ``MAX_RESPONSE_BYTES`` is replaced by an
    error that says so (the broker would disconnect the core for an oversized packet)."""
    body = {"ok": resp.ok, "data": _finite(resp.data), "error": resp.error[:4000]}
    out = json.dumps(body, default=_default, allow_nan=False, separators=(",", ":")).encode()
    if len(out) > MAX_RESPONSE_BYTES:
        done = ("the command was carried out, but " if resp.ok else "")
        body = {"ok": False, "data": None,
                "error": f"{done}the answer is {len(out)} bytes, more than the "
                         f"{MAX_RESPONSE_BYTES} one message may carry; ask for less (a limit, "
                         "a node, fewer workloads)"}
        out = json.dumps(body).encode()
    return out


def parse_response(payload: bytes) -> Response:
    raw = load_json(payload)
    if not isinstance(raw, dict) or "ok" not in raw:
        raise WireError("schema", "response must be an object with 'ok'")
    return Response(ok=bool(raw["ok"]), data=raw.get("data"), error=str(raw.get("error") or ""))
