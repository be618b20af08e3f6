"""Helpers for the crash faults on the test cluster's real node (tests/cluster/
test_helm_install.py): a container killed through the runtime (containerd's ``ctr``, as a
crash or the OOM killer would, not the API), and the counters that tell what it cost, read
from Prometheus text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
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


@dataclass
class CoreWatch:
    """The core replicas seen while a fault or an upgrade goes on, one sample at a time:
    every core process's accepted reports (the first and the last value seen of each pod:
    a pod is one process here, as no core container restarts meanwhile), and each sample's
    leaders (the pods whose ``cfnet_leader`` is 1) with the Lease's holder."""

    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    duplicates: dict[str, float] = field(default_factory=dict)
    leaders: list[tuple[float, tuple[str, ...], str]] = field(default_factory=list)

    def add(self, t: float, scraped: dict[str, Samples], holder: str) -> None:
        for pod, m in scraped.items():
            acc = value(m, "cfnet_reports_total", result="accepted")
            self.first.setdefault(pod, acc)
            self.last[pod] = acc
            self.duplicates[pod] = value(m, "cfnet_reports_total", result="duplicate")
        self.leaders.append((t, tuple(sorted(p for p, m in scraped.items()
                                             if value(m, "cfnet_leader") == 1)), holder))

    def accepted(self, at_start: set[str]) -> float:
        """Reports accepted over the watch, every process summed: the pods there at the
        start from their first value, the pods started meanwhile from 0."""
        return sum(self.last[p] - (self.first[p] if p in at_start else 0.0)
                   for p in self.last)

    def two_leaders(self) -> list[tuple[float, tuple[str, ...], str]]:
        return [s for s in self.leaders if len(s[1]) > 1]

    def holders(self) -> list[str]:
        """The Lease's holders in the order seen, repeats folded."""
        out: list[str] = []
        for _, _, h in self.leaders:
            if h and (not out or out[-1] != h):
                out.append(h)
        return out
