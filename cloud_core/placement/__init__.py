"""cfnet's placement engine: pure filters and scores over frozen snapshots, a global OR-Tools
solver for batches, explanations, re-placement with forecasts, and an independent validator.

See ``docs/placement.md`` for the contract.
"""

from __future__ import annotations

from collections.abc import Sequence

from cloud_core.errors import PlacementError, SpecError

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
from .validate import Violation, nodes_that_fit, validate


def prepare(snapshot: ClusterSnapshot, config: EngineConfig | None = None) -> PreparedCluster:
    """Build the per-snapshot indexes once, for many ``place`` / ``explain`` calls."""
    return PreparedCluster(snapshot, config)


def place(snapshot: ClusterSnapshot, workloads: Sequence[Workload],
          config: EngineConfig | None = None) -> PlacementResult:
    """Place a batch of workloads together on ``snapshot``."""
    return PreparedCluster(snapshot, config).place(workloads)


def explain(snapshot: ClusterSnapshot, workload: Workload, config: EngineConfig | None = None,
            node: str | None = None) -> Explanation:
    """Why ``workload`` fits where it fits, and (with ``node``) what that node says."""
    return PreparedCluster(snapshot, config).explain(workload, node)


__all__ = [
    "ClusterSnapshot", "Decision", "EngineConfig", "Explanation", "Health", "LabelSelector",
    "LinkInfo", "Move", "NodeInfo", "NodeSelectorRequirement", "NodeSelectorTerm",
    "PlacementError", "PlacementResult", "PodAffinityTerm", "PreparedCluster",
    "ReplanConfig", "ReplanState", "Resources", "RunningPod", "ScoreWeights", "SpecError",
    "Taint", "Toleration", "Violation", "Workload", "explain", "nodes_that_fit", "parse_pod",
    "parse_workload_yaml", "place", "plan_moves", "prepare", "validate",
]
