"""Bounded values of a workload spec: quantities, mappings, lists, label maps, numbers,
free text and names. Each refusal is a ``SpecError`` naming the field and the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from cloud_core.errors import SpecError

from . import quantity
from .names import NAME_MAX, label_key_problem, label_value_problem, name_problem


def parse_quantity(value: Any, field: str, kind: str) -> int:
    """A Kubernetes quantity (``resource.ParseQuantity``, see ``quantity.py``): ``kind``
    "cpu" gives millicores (``MilliValue``: rounded up), "mem" bytes (``Value``: rounded
    up), "count" whole units (extended resources must be integers). Negative values are
    refused as the API server refuses negative requests and capacities."""
    if isinstance(value, bool) or value is None:
        raise SpecError(field, f"{value!r} is not a quantity")
    if isinstance(value, int) and value.bit_length() > 128:
        raise SpecError(field, "is too large: an integer of more than 128 bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(field, f"{value!r} is not a finite quantity")
    if not isinstance(value, str | int | float):
        raise SpecError(field, f"a {type(value).__name__} is not a quantity")
    try:
        q = quantity.parse(str(value).strip())  # UnmarshalJSON trims spaces too
        if q.negative and q.mantissa:
            raise quantity.QuantityError("must be greater than or equal to 0")
        if kind == "cpu":
            return q.scaled(3, "millicores")
        if kind == "mem":
            return q.scaled(0, "bytes")
        milli = q.scaled(3, "milli-units")
    except quantity.QuantityError as exc:
        raise SpecError(field, str(exc)) from exc
    if milli % 1000:
        raise SpecError(field, f"{value!r} must be a whole number")
    return milli // 1000


def as_map(obj: Any, field: str) -> Mapping[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise SpecError(field, f"must be a mapping, got {type(obj).__name__}")
    return obj


def as_list(obj: Any, field: str) -> Sequence[Any]:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise SpecError(field, f"must be a list, got {type(obj).__name__}")
    return obj


def str_map(obj: Any, field: str, labels: bool = True) -> dict[str, str]:
    """A string map; ``labels``: keys and values checked as Kubernetes label keys and values
    (``ValidateLabels``: metadata.labels, nodeSelector, matchLabels), else any strings
    (annotations)."""
    out = {}
    for k, v in as_map(obj, field).items():
        if not isinstance(k, str) or not isinstance(v, str | int | float) or isinstance(v, bool):
            raise SpecError(f"{field}.{clip(k)}", "labels and selectors map strings to strings")
        out[k] = str(v)
        if labels:
            why = label_key_problem(k) or label_value_problem(out[k])
            if why:
                raise SpecError(f"{field}.{clip(k)}", why)
    return out


def clip(v: object, n: int = 64) -> str:
    """A value for an error message: short, and printable (errors reach terminals)."""
    s = str(v)
    s = s if len(s) <= n else s[: n - 3] + "..."
    return "".join(c if c.isprintable() else "?" for c in s)


def number(v: Any, field: str, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(v, bool):
        raise SpecError(field, f"{v!r} is not a number")
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise SpecError(field, f"{clip(v)!r} is not a number") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise SpecError(field, f"{v!r} is not a finite number")
    if x < minimum or (strict and x <= minimum):
        raise SpecError(field, f"{v!r} must be {'>' if strict else '>='} {minimum:g}")
    return x


def text(v: Any, field: str, max_len: int = NAME_MAX) -> str:
    """A free-text reference (a data set, a gang, a zone): a short printable string."""
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise SpecError(field, "must be a string")
    t = str(v)
    if len(t) > max_len or not t.isprintable():
        raise SpecError(field, f"must be at most {max_len} printable characters")
    return t


def whole(v: Any, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise SpecError(field, f"{clip(v)!r} is not an integer")
    if (isinstance(v, int) and v.bit_length() > 64) or (isinstance(v, str) and len(v) > 24):
        raise SpecError(field, "is out of range (more than 64 bits)")
    try:
        x = int(str(v).strip())
    except ValueError:
        raise SpecError(field, f"{clip(v)!r} is not an integer") from None
    if x < 0:
        raise SpecError(field, f"{x} must be >= 0")
    return x


def check_name(value: object, field: str, max_len: int) -> None:
    """The one name rule (``names``) for every name a workload carries."""
    if why := name_problem(value, max_len):
        raise SpecError(field, why)
