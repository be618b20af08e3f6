"""Core-side console: turns a validated request into a response, reading the state snapshot.

Commands are small functions registered by name; each gets the snapshot and
the request's args and returns JSON-able data or raises :class:`CommandError`
with a message meant for the operator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from cloud_core.console.protocol import Request, Response
from cloud_core.ingest import Ingest
from cloud_core.state import ClusterState, StateSnapshot
from cloud_core.view import link_rows, node_rows

log = logging.getLogger(__name__)


class CommandError(Exception):
    """A request that can't be served; the message goes to the operator as is."""


Handler = Callable[[StateSnapshot, dict[str, Any]], Any]


class ConsoleService:
    def __init__(
        self, state: ClusterState, ingest: Ingest, clock: Callable[[], float] = time.time
    ) -> None:
        self.state = state
        self.ingest = ingest
        self._clock = clock
        self.handlers: dict[str, Handler] = {
            "nodes": self._nodes,
            "links": self._links,
            "stats": self._stats,
        }

    def register(self, cmd: str, handler: Handler) -> None:
        self.handlers[cmd] = handler

    def handle(self, operator: str, req: Request) -> Response:
        fn = self.handlers.get(req.cmd)
        if fn is None:
            known = ", ".join(sorted(self.handlers))
            return Response(ok=False, error=f"unknown command {req.cmd!r}; known: {known}")
        try:
            return Response(ok=True, data=fn(self.state.snapshot(self._clock()), req.args))
        except CommandError as exc:
            return Response(ok=False, error=str(exc))
        except Exception as exc:
            log.exception("console command %s from %s failed", req.cmd, operator)
            return Response(ok=False, error=f"internal error in {req.cmd}: {exc}")

    def _nodes(self, snap: StateSnapshot, args: dict[str, Any]) -> Any:
        return node_rows(snap)

    def _links(self, snap: StateSnapshot, args: dict[str, Any]) -> Any:
        node = args.get("node")
        if node is not None and node not in snap.nodes:
            raise CommandError(f"no node {node!r}; `cfnetctl nodes` lists them")
        return link_rows(snap, node)

    def _stats(self, snap: StateSnapshot, args: dict[str, Any]) -> Any:
        c = self.ingest.counters()
        return {
            "accepted": c.accepted, "duplicates": c.duplicates, "statuses": c.statuses,
            "rejected": c.rejected, "nodes": len(snap.nodes), "links": len(snap.links),
        }
