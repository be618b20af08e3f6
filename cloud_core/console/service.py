"""Core-side console: authorise, run and audit each operator request.

Commands are small functions registered by name with the least role allowed
to run them. Each gets the operator's name and the request's args and returns
JSON-able data, or raises :class:`CommandError` with a message meant for the
operator. Every request — allowed, refused or failed — is written to the
audit log (who, what, when, result).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cloud_core.console.protocol import Request, Response, parse_request
from edge_agent.wire import WireError

log = logging.getLogger(__name__)

ROLES = ("viewer", "operator", "admin")
# The least role of every command that needs more than "viewer", for both consoles:
# the local one (console/commands.py) and the Kubernetes one (k8s/console.py) register
# their own handlers under the same names, and take the role from here, so the two
# modes cannot drift apart on who may do what.
COMMAND_ROLES: dict[str, str] = {
    "submit": "operator", "delete": "operator", "cordon": "operator",
    "uncordon": "operator", "drain": "operator", "audit": "admin",
}
T = TypeVar("T")


class CommandError(Exception):
    """A request that can't be served; the message goes to the operator as is."""


def jsonable(o: Any) -> Any:
    """``o`` (dataclasses, mappings such as frozen label maps, sequences) as plain JSON types,
    for a console answer; shared by the local and the Kubernetes console."""
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {f.name: jsonable(getattr(o, f.name)) for f in dataclasses.fields(o)}
    if isinstance(o, dict):
        return {str(k): jsonable(v) for k, v in o.items()}
    if isinstance(o, list | tuple | set | frozenset):
        return [jsonable(v) for v in o]
    if hasattr(o, "items"):  # frozen label maps
        return {str(k): jsonable(v) for k, v in o.items()}
    return o


def paged(rows: Sequence[T], args: dict[str, Any], row: Callable[[T], Any]) -> Any:
    """A listing's page: ``args`` may give ``offset`` and ``limit`` (non-negative integers;
    no limit: to the end). ``row`` renders only the rows on the page. With ``"total": true``
    the answer is ``{"items", "total", "offset"}``, so a client can say that the list was
    cut; without it, the bare list (the answer's shape before paging existed)."""
    offset, limit, total = args.get("offset", 0), args.get("limit"), args.get("total", False)
    for k, v in (("offset", offset), ("limit", limit)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise CommandError(f"{k} must be a non-negative integer")
    if not isinstance(total, bool):
        raise CommandError("total must be true or false")
    items = [row(r) for r in rows[offset:None if limit is None else offset + limit]]
    return {"items": items, "total": len(rows), "offset": offset} if total else items


Handler = Callable[[str, dict[str, Any]], Any]
AuditSink = Callable[[float, str, str, dict[str, Any], str, str], None]


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    handler: Handler
    role: str = "viewer"  # the least role allowed
    help: str = ""


class ConsoleService:
    def __init__(
        self,
        roles: Callable[[str], str | None],
        audit: AuditSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._roles = roles
        self._audit = audit
        self._clock = clock
        self.commands: dict[str, Command] = {}

    def register(self, name: str, handler: Handler, role: str | None = None,
                 help: str = "") -> None:
        """Register (or replace) ``name``; its role is ``COMMAND_ROLES``' (else viewer), and
        an explicit ``role`` that disagrees with the table is refused."""
        want = COMMAND_ROLES.get(name, "viewer")
        if role is None:
            role = want
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        if name in COMMAND_ROLES and role != want:
            raise ValueError(f"command {name!r} needs role {want!r} (COMMAND_ROLES), not {role!r}")
        self.commands[name] = Command(name, handler, role, help)

    def handle_message(self, operator: str, payload: bytes, *, retain: bool = False) -> Response:
        """One raw request as it came off the broker: a retained one is never executed (it
        would run again on every core restart), one that cannot be parsed is refused with
        the reason; both are answered and audited, like every other request."""
        if retain:
            cmd = "(retained)"
            with contextlib.suppress(WireError):
                cmd = parse_request(payload).cmd
            return self._refuse(operator, cmd, {"bytes": len(payload)},
                                "retained requests are never executed; clear the retained "
                                "message (publish an empty retained payload) and send it "
                                "without the retain flag")
        try:
            req = parse_request(payload)
        except WireError as exc:
            return self._refuse(operator, "(unparsed)", {"bytes": len(payload)},
                                f"bad request ({exc.reason}): {exc.detail}")
        return self.handle(operator, req)

    def refuse(self, operator: str, why: str) -> Response:
        """Refuse a request without reading it (the caller's bound was hit); audited."""
        return self._refuse(operator, "(refused)", {}, why)

    def _refuse(self, operator: str, cmd: str, args: dict[str, Any], why: str) -> Response:
        resp = Response(ok=False, error=why)
        self._write_audit(operator, cmd, args, f"refused: {why}")
        return resp

    def _write_audit(self, operator: str, cmd: str, args: dict[str, Any], result: str) -> None:
        if self._audit is None:
            return
        try:
            self._audit(self._clock(), operator, cmd, args, result, "")
        except Exception:
            log.exception("audit write failed")

    def handle(self, operator: str, req: Request) -> Response:
        resp = self._handle(operator, req)
        self._write_audit(operator, req.cmd, req.args,
                          "ok" if resp.ok else f"error: {resp.error}")
        return resp

    def _handle(self, operator: str, req: Request) -> Response:
        cmd = self.commands.get(req.cmd)
        if cmd is None:
            known = ", ".join(sorted(self.commands))
            return Response(ok=False, error=f"unknown command {_printable(req.cmd)!r}; "
                                            f"known: {known}")
        role = self._roles(operator)
        if role is None:
            return Response(
                ok=False,
                error=f"operator {operator!r} has no role on this core; ask an admin to add one",
            )
        if ROLES.index(role) < ROLES.index(cmd.role):
            return Response(
                ok=False,
                error=f"permission denied: {req.cmd!r} needs role {cmd.role!r}; "
                f"{operator!r} is {role!r}",
            )
        try:
            return Response(ok=True, data=cmd.handler(operator, req.args))
        except CommandError as exc:
            return Response(ok=False, error=str(exc))
        except Exception as exc:
            log.exception("console command %s from %s failed", req.cmd, operator)
            return Response(ok=False, error=f"internal error in {req.cmd}: {str(exc)[:200]}")


def _printable(s: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in s)
