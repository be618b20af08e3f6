"""Console request/response messages (JSON), shared by `cfnetctl` and the core.

A request is ``{"cmd": str, "args": {...}}`` published to the operator's own
request topic with an MQTT 5 response topic and correlation data; the reply is
``{"ok": bool, "data": ..., "error": str}`` on that response topic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from edge_agent.wire import WireError, load_json

MAX_REQUEST_BYTES = 64 * 1024


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
    if len(payload) > MAX_REQUEST_BYTES:
        raise WireError("oversized", f"request of {len(payload)} bytes")
    raw = load_json(payload)
    if not isinstance(raw, dict) or not isinstance(raw.get("cmd"), str):
        raise WireError("schema", "request must be an object with a string 'cmd'")
    args = raw.get("args") or {}
    if not isinstance(args, dict):
        raise WireError("schema", "'args' must be an object")
    return Request(cmd=raw["cmd"][:64], args=args)


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


def encode_response(resp: Response) -> bytes:
    body = {"ok": resp.ok, "data": _finite(resp.data), "error": resp.error}
    return json.dumps(body, default=_default, allow_nan=False).encode()


def parse_response(payload: bytes) -> Response:
    raw = load_json(payload)
    if not isinstance(raw, dict) or "ok" not in raw:
        raise WireError("schema", "response must be an object with 'ok'")
    return Response(ok=bool(raw["ok"]), data=raw.get("data"), error=str(raw.get("error") or ""))
