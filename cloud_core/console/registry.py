"""The console's one command registry: each command's name, least role and argument bounds.

A command is a module-level handler ``(context, operator, args) -> JSON-able data``,
registered by name with :meth:`CommandRegistry.command`, which declares beside it the least
role that may run it and the :class:`Bounds` of its arguments. The console service refuses
a request outside those bounds with the reason before the handler runs, so a handler reads
arguments that are already bounded. A handler raises :class:`CommandError` with a message
meant for the operator. The registry is filled once, when the module that declares the
commands is imported (``cloud_core.console.commands``), and read only after that; a name
registered twice is refused.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

ROLES = ("viewer", "operator", "admin")
T = TypeVar("T")
# Names the console takes (a node, a workload, a namespace): a Kubernetes object name's
# longest (a DNS subdomain). Past it the lookup cannot succeed, and the refusal would echo it.
NAME_ARG_MAX = 253
# The JSON of one workload document; a Pod spec needs far less.
MAX_DOC_BYTES = 32 * 1024
MAX_SUBMIT = 1000  # workloads per request (submit, what-if), replicas counted


class CommandError(Exception):
    """A request that can't be served; the message goes to the operator as is."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The limits on one command's arguments, checked before the command runs.

    ``limit``: ``limit`` is an integer within these (inclusive). ``paged``: ``offset`` and
    ``limit`` are non-negative integers and ``total`` is true or false (:func:`paged`).
    ``specs``: ``specs`` is a non-empty list of at most this many workload documents, each a
    mapping of at most ``MAX_DOC_BYTES`` of JSON (0: the command takes none). ``names``:
    these arguments, when strings, are at most ``NAME_ARG_MAX`` characters.
    """

    limit: tuple[int, int] | None = None
    paged: bool = False
    specs: int = 0
    names: tuple[str, ...] = ()

    def problem(self, args: Mapping[str, Any]) -> str | None:
        """Why ``args`` are outside these bounds (None: they are within)."""
        for name in self.names:
            v = args.get(name)
            if isinstance(v, str) and len(v) > NAME_ARG_MAX:
                return f"{name}: {len(v)} characters, more than {NAME_ARG_MAX}"
        if self.limit is not None and "limit" in args:
            lo, hi = self.limit
            v = args["limit"]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                return f"limit must be an integer within {lo}..{hi}"
        if self.paged:
            for k in ("offset", "limit"):
                v = args.get(k)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                    return f"{k} must be a non-negative integer"
            if not isinstance(args.get("total", False), bool):
                return "total must be true or false"
        if self.specs:
            return _specs_problem(args.get("specs"), self.specs)
        return None


def _specs_problem(raw: Any, most: int) -> str | None:
    if not isinstance(raw, list) or not raw:
        return "expected 'specs': a non-empty list of workload documents"
    if len(raw) > most:
        return f"at most {most} workloads per request"
    for i, doc in enumerate(raw):
        if not isinstance(doc, dict):
            return f"document {i + 1}: must be a mapping"
        size = len(json.dumps(doc))
        if size > MAX_DOC_BYTES:
            return (f"document {i + 1}: {size} bytes, more than the {MAX_DOC_BYTES} one "
                    "workload document may have")
    return None


Handler = Callable[[Any, str, dict[str, Any]], Any]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True, slots=True)
class Command:
    """One registered command: its handler, the least role allowed, its argument bounds."""
    name: str
    handler: Handler
    role: str
    bounds: Bounds
    help: str = ""


class CommandRegistry:
    """Commands by name; :meth:`command` registers one (see the module docstring)."""

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}
        self.commands: Mapping[str, Command] = MappingProxyType(self._commands)

    def command(self, name: str, *, role: str = "viewer", bounds: Bounds = Bounds(),
                help: str = "") -> Callable[[H], H]:
        """Decorator: register the handler under ``name``, with its role and bounds."""
        if role not in ROLES:
            raise ValueError(f"command {name!r}: unknown role {role!r}")

        def register(handler: H) -> H:
            if name in self._commands:
                raise ValueError(f"command {name!r} is registered twice")
            self._commands[name] = Command(name, handler, role, bounds, help)
            return handler

        return register


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
    """A listing's page, for a command with ``Bounds(paged=True)`` (which bounded ``offset``,
    ``limit`` and ``total``): no limit is to the end. ``row`` renders only the rows on the
    page. With ``"total": true`` the answer is ``{"items", "total", "offset"}``, so a client
    can say that the list was cut; without it, the bare list (the answer's shape before
    paging existed)."""
    offset, limit = args.get("offset") or 0, args.get("limit")
    items = [row(r) for r in rows[offset:None if limit is None else offset + limit]]
    return {"items": items, "total": len(rows), "offset": offset} if args.get("total") else items


def node_arg(args: dict[str, Any], known: Callable[[], Collection[str]]) -> str:
    """The ``node`` argument, which must name one of ``known()``."""
    node = args.get("node")
    if not isinstance(node, str) or not node:
        raise CommandError("expected a node name")
    if node not in known():
        raise CommandError(f"no node {node!r}; `cfnetctl nodes` lists them")
    return node
