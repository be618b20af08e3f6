"""The cfnet fields of a workload: ``cfnet.io/`` annotations on a pod, or the same fields
as camelCase keys of the plain form, read through one set of rules (latency bound, data
residency, security level, data set, cost weight, gang).
"""

from __future__ import annotations

from typing import Any

from cloud_core.errors import SpecError

from .spec_values import number, text, whole

ANN = "cfnet.io/"
POLICIES = ("cost", "spread")


def cfnet_fields(get: Any, prefix: str, field_name: Any) -> dict[str, Any]:
    """The cfnet fields, read through ``get(key)`` under either naming scheme."""
    out: dict[str, Any] = {}
    v = get("max-latency-ms")
    if v is not None:
        out["max_latency_ms"] = number(v, field_name("max-latency-ms"), strict=True)
    v = get("latency-to")
    if v is not None:
        if not isinstance(v, str) or not v.strip():
            raise SpecError(field_name("latency-to"), "must name a node, zone or region")
        out["latency_to"] = text(v.strip(), field_name("latency-to"))
    if "max_latency_ms" in out and "latency_to" not in out:
        raise SpecError(field_name("latency-to"), "is required with max-latency-ms")
    v = get("residency")
    if v is not None:
        items = v.split(",") if isinstance(v, str) else v
        if not isinstance(items, list):
            raise SpecError(field_name("residency"), "must be a comma list of regions")
        regions = frozenset(text(str(x).strip(), field_name("residency"))
                            for x in items[:64] if str(x).strip())
        if not regions:
            raise SpecError(field_name("residency"), "names no region")
        out["residency"] = regions
    v = get("min-security-level")
    if v is not None:
        out["min_security_level"] = whole(v, field_name("min-security-level"))
    v = get("data")
    if v is not None:
        out["data_name"] = text(v, field_name("data"))
    v = get("data-gb")
    if v is not None:
        out["data_gb"] = number(v, field_name("data-gb"))
    v = get("data-location")
    if v is not None:
        out["data_location"] = text(v, field_name("data-location"))
    v = get("cost-weight")
    if v is not None:
        out["cost_weight"] = number(v, field_name("cost-weight"))
    v = get("gang")
    if v is not None:
        out["gang"] = text(v, field_name("gang"))
    return out
