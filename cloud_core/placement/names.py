"""The naming rule for every name a workload carries, and Kubernetes' label syntax, for the
pure placement engine (which imports nothing from the agent or the wire).

The same rule as ``edge_agent.wire.names`` (ids and labels on the wire):
tests/unit/test_names.py holds the two equal on a table of names and on generated ones.
Workload names, namespaces and uids: lowercase letters, digits, ``-``, ``.`` and ``_``,
starting and ending with a letter or digit (a DNS-1123 name that also allows ``_``),
bounded in length: ``ID_MAX`` (63, a DNS label) for namespaces, ``NAME_MAX`` (253, a DNS
subdomain, the longest Kubernetes object name) for workload names and uids (``uid`` may
hold one ``/`` between a namespace and a name). No control characters, spaces, upper case
or escape sequences can reach a terminal, a topic or a log line through a name.

Label keys and values follow ``k8s.io/apimachinery/pkg/util/validation``: a key is a
qualified name (optional DNS-subdomain prefix of at most 253 characters and ``/``, then a
name of at most 63 of ``[A-Za-z0-9._-]`` starting and ending alphanumeric); a value is empty
or such a name part.
"""

from __future__ import annotations

import re

ID_MAX = 63
NAME_MAX = 253
_NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?")
_QNAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")


def name_problem(value: object, max_len: int = ID_MAX) -> str | None:
    """Why ``value`` is not a valid name (None: it is)."""
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > max_len:
        return f"is {len(value)} characters long, more than {max_len}"
    if not _NAME.fullmatch(value):
        return ("must be lowercase letters, digits, '-', '.' or '_', starting and ending "
                "with a letter or digit")
    return None


def valid_name(value: object, max_len: int = ID_MAX) -> bool:
    return name_problem(value, max_len) is None


def uid_problem(value: object) -> str | None:
    """A workload uid: a name, or ``namespace/name``."""
    if isinstance(value, str) and value.count("/") == 1:
        ns, _, name = value.partition("/")
        return name_problem(ns, ID_MAX) or name_problem(name, NAME_MAX)
    return name_problem(value, NAME_MAX)


def label_key_problem(key: object) -> str | None:
    """Kubernetes ``IsQualifiedName``."""
    if not isinstance(key, str) or not key:
        return "a label key must be a non-empty string"
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.fullmatch(prefix)):
        return "a label key's prefix must be a DNS subdomain of at most 253 characters"
    if not name or len(name) > 63 or not _QNAME.fullmatch(name):
        return ("a label key's name must be at most 63 characters of [A-Za-z0-9._-], "
                "starting and ending with a letter or digit")
    return None


def label_value_problem(value: str) -> str | None:
    """Kubernetes ``IsValidLabelValue``."""
    if len(value) > 63:
        return f"a label value is at most 63 characters (got {len(value)})"
    if value and not _QNAME.fullmatch(value):
        return ("a label value must be empty or [A-Za-z0-9._-], starting and ending with a "
                "letter or digit")
    return None
