"""Core-side console: authorise, bound, run and audit each operator request.

Commands come from the one registry (:mod:`cloud_core.console.registry`, filled by
:mod:`cloud_core.console.commands`), each with the least role allowed to run it and the
bounds of its arguments. A request for an unknown command, from an operator without the
role, or with arguments outside the bounds is refused with the reason; one that passes runs
the command's handler on the console's :class:`~cloud_core.console.context.ConsoleContext`.
Every request — allowed, refused or failed — is written to the audit log (who, what, when,
result).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from cloud_core.console.context import Cluster, ConsoleContext
from cloud_core.console.protocol import Request, Response, parse_request
from cloud_core.console.registry import ROLES, Command, CommandError
from edge_agent.wire import WireError

log = logging.getLogger(__name__)

AuditSink = Callable[[float, str, str, dict[str, Any], str, str], None]


class ConsoleService:
    """Serves requests with ``commands`` (``cloud_core.console.commands.COMMANDS``) on
    ``context``; ``roles`` names each operator's role (None: no role on this core)."""

    def __init__(
        self,
        roles: Callable[[str], str | None],
        context: ConsoleContext,
        *,
        commands: Mapping[str, Command],
        audit: AuditSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._roles = roles
        self.context = context
        self.commands = commands
        self._audit = audit
        self._clock = clock

    def use_cluster(self, cluster: Cluster) -> None:
        """Answer the cluster commands from ``cluster`` from now on (``cfnet-core
        --kubernetes`` gives the Kubernetes one before any request can arrive)."""
        self.context.cluster = cluster

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
        if (why := cmd.bounds.problem(req.args)) is not None:
            return Response(ok=False, error=why)
        try:
            return Response(ok=True, data=cmd.handler(self.context, operator, req.args))
        except CommandError as exc:
            return Response(ok=False, error=str(exc))
        except Exception as exc:
            log.exception("console command %s from %s failed", req.cmd, operator)
            return Response(ok=False, error=f"internal error in {req.cmd}: {str(exc)[:200]}")


def _printable(s: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in s)
