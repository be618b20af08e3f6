"""Core-side console: authorise, run and audit each operator request.

Commands are small functions registered by name with the least role allowed
to run them. Each gets the operator's name and the request's args and returns
JSON-able data, or raises :class:`CommandError` with a message meant for the
operator. Every request — allowed, refused or failed — is written to the
audit log (who, what, when, result).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cloud_core.console.protocol import Request, Response

log = logging.getLogger(__name__)

ROLES = ("viewer", "operator", "admin")


class CommandError(Exception):
    """A request that can't be served; the message goes to the operator as is."""


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

    def register(self, name: str, handler: Handler, role: str = "viewer", help: str = "") -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        self.commands[name] = Command(name, handler, role, help)

    def handle(self, operator: str, req: Request) -> Response:
        resp = self._handle(operator, req)
        if self._audit is not None:
            result = "ok" if resp.ok else f"error: {resp.error}"
            try:
                self._audit(self._clock(), operator, req.cmd, req.args, result, "")
            except Exception:
                log.exception("audit write failed")
        return resp

    def _handle(self, operator: str, req: Request) -> Response:
        cmd = self.commands.get(req.cmd)
        if cmd is None:
            known = ", ".join(sorted(self.commands))
            return Response(ok=False, error=f"unknown command {req.cmd!r}; known: {known}")
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
            return Response(ok=False, error=f"internal error in {req.cmd}: {exc}")
