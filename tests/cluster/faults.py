"""Helpers for the crash faults on the test cluster's real node (tests/cluster/
test_helm_install.py): a container killed through the runtime (containerd's ``ctr``, as a
crash or the OOM killer would, not the API), and the counters that tell what it cost, read
from Prometheus text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """(name, sorted labels) -> value of every sample in a Prometheus exposition."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def value(m: Samples, name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """The pod's status of container ``name`` ({} when the kubelet has not reported it)."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == name:
            return dict(c)
    return {}


def container_id(pod: dict[str, Any], name: str) -> str:
    """containerd's id of the running container ``name`` (``containerd://<id>``)."""
    cid = str(container(pod, name).get("containerID") or "")
    scheme, _, ident = cid.partition("://")
    assert scheme == "containerd" and ident, f"no containerd id for {name}: {cid!r}"
    return ident


def sigkill(ctr: Callable[..., list[str]], run: Callable[[list[str]], Any], cid: str) -> None:
    """SIGKILL the task of container ``cid`` through containerd (``ctr tasks kill``): the
    process dies at once, nothing of it runs its shutdown; the kubelet sees the exit."""
    r = run(ctr("tasks", "kill", "-s", "SIGKILL", cid))
    assert r.returncode == 0, f"ctr tasks kill {cid}: {r.stdout}{r.stderr}"


def agent_drops(m: Samples) -> float:
    """Reports the agent lost for good: thinned, expired or refused (its buffer's counts)."""
    return sum(value(m, "cfnet_agent_buffer_dropped_total", why=w)
               for w in ("thinned", "expired", "refused"))


def scheduled_per_pod(events: list[dict[str, Any]]) -> dict[str, int]:
    """How many ``Scheduled`` events (bindings) each pod has (events.k8s.io/v1 items)."""
    out: dict[str, int] = {}
    for e in events:
        if e.get("reason") == "Scheduled":
            name = str((e.get("regarding") or {}).get("name"))
            out[name] = out.get(name, 0) + int(e.get("deprecatedCount") or 1)
    return out
