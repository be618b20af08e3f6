"""cfnet's placement engine: pure filters and scores over frozen snapshots, a global OR-Tools
solver for batches, explanations, re-placement with forecasts, and an independent validator.

See ``docs/placement.md`` for the contract.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable, Sequence

from cloud_core.errors import PlacementError, SpecError

from .carry import Carry
from .config import EngineConfig, ScoreWeights
from .engine import Decision, PlacementResult, PreparedCluster
from .explain import Explanation
from .model import (
    ClusterSnapshot,
    Health,
    LabelSelector,
    LinkInfo,
    NodeInfo,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Resources,
    RunningPod,
    Taint,
    Toleration,
    Workload,
)
from .replan import Move, ReplanConfig, ReplanState, plan_moves
from .spec import parse_pod, parse_workload_yaml
from .validate import NodeFacts, Violation, nodes_that_fit, validate


def prepare(snapshot: ClusterSnapshot, config: EngineConfig | None = None) -> PreparedCluster:
    """Build the per-snapshot indexes once, for many ``place`` / ``explain`` calls."""
    return PreparedCluster(snapshot, config)


def place(snapshot: ClusterSnapshot, workloads: Sequence[Workload],
          config: EngineConfig | None = None, *, carry: Carry | None = None,
          facts: Hashable | None = None, cpu_start: float | None = None) -> PlacementResult:
    """Place a batch of workloads together on ``snapshot`` (indexes built as the batch
    needs them). With ``carry``, the prepared cluster is kept for the next call, whose
    snapshot reuses its indexes when ``facts`` is the same token (``carry.py``).
    ``cpu_start``: the calling thread's ``time.thread_time()`` at the decision step's
    start, from which a small batch's CPU budget counts (default: this call's start;
    ``budget.py``)."""
    if cpu_start is None:
        cpu_start = time.thread_time()  # preparing the snapshot counts too
    if carry is None:
        return PreparedCluster(snapshot, config, eager=False).place(workloads, cpu_start)
    return carry.prepare(snapshot, config or EngineConfig(), facts).place(workloads,
                                                                          cpu_start)


def explain(snapshot: ClusterSnapshot, workload: Workload, config: EngineConfig | None = None,
            node: str | None = None) -> Explanation:
    """Why ``workload`` fits where it fits, and (with ``node``) what that node says.

    If the workload already runs (a pod with its uid is in ``snapshot.pods``), it is taken
    out first: it must not crowd or repel itself in its own explanation.
    """
    return PreparedCluster(without_pod(snapshot, workload.uid), config).explain(workload, node)


def without_pod(snapshot: ClusterSnapshot, uid: str) -> ClusterSnapshot:
    """``snapshot`` as if the running pod ``uid`` were gone (its node's resources freed)."""
    gone = [p for p in snapshot.pods if p.uid == uid]
    if not gone:
        return snapshot
    freed = {p.node: p.requests for p in gone}
    nodes = tuple(dataclasses.replace(n, allocated=n.allocated - freed[n.name])
                  if n.name in freed else n for n in snapshot.nodes)
    return dataclasses.replace(snapshot, nodes=nodes,
                               pods=tuple(p for p in snapshot.pods if p.uid != uid))


__all__ = [
    "Carry", "ClusterSnapshot", "Decision", "EngineConfig", "Explanation", "Health",
    "LabelSelector", "LinkInfo", "Move", "NodeFacts", "NodeInfo", "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "PlacementError", "PlacementResult", "PodAffinityTerm", "PreparedCluster",
    "ReplanConfig", "ReplanState", "Resources", "RunningPod", "ScoreWeights", "SpecError",
    "Taint", "Toleration", "Violation", "Workload", "explain", "nodes_that_fit", "parse_pod",
    "parse_workload_yaml", "place", "plan_moves", "prepare", "validate", "without_pod",
]
