"""The placement flags both Kubernetes schedulers take (``python -m cloud_core.k8s`` and
``cfnet-core --kubernetes``), so that they run the engine with the same defaults.

No Kubernetes client here: ``cfnet-core`` parses its arguments before it knows its mode.
Nor the placement engine (numpy, OR-Tools: most of the start-up's imports): ``cfnet-core
--kubernetes`` asks for its first lists right after parsing, before importing it
(``prefetch.py``); ``scheduler_engine_config`` imports it when called.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cloud_core.k8s.evict import EvictionPolicy, parse_namespaces

if TYPE_CHECKING:
    from cloud_core.placement.config import EngineConfig

# placement.spec_annotations.POLICIES, without importing the engine to parse the command
# line (the engine refuses any other: tests/unit/test_podspec_fields.py checks they are the
# same)
POLICIES = ("cost", "spread")


def add_scheduler_args(p: argparse.ArgumentParser | Any) -> None:
    """``--placement-policy`` and ``--exact-packing`` on a parser or argument group."""
    p.add_argument("--placement-policy", choices=POLICIES, default="cost",
                   help="cost: pack by price/energy/carbon (default); spread: kube-scheduler's "
                        "default scores, pod by pod. A pod may choose with the "
                        "cfnet.io/placement-policy annotation")
    p.add_argument("--exact-packing", action="store_true",
                   help="let CP-SAT polish and prove each coupled batch optimal (seconds per "
                        "batch; default: the min-cost-flow / packing answer improved by "
                        "bounded CP-SAT neighbourhoods, which also look for room for pods "
                        "left out)")


def add_eviction_args(p: argparse.ArgumentParser | Any) -> None:
    """``--evict-exclude-namespaces``: the descheduler's ``namespaces.exclude``."""
    p.add_argument("--evict-exclude-namespaces", default="kube-system", metavar="NS[,NS...]",
                   type=parse_namespaces,
                   help="namespaces whose pods cfnet never evicts, to re-place them or for "
                        "the console's drain (comma-separated; default kube-system; '' none)")


def eviction_policy(args: argparse.Namespace) -> EvictionPolicy:
    """The eviction policy the flags select (the DefaultEvictor's other defaults kept)."""
    return EvictionPolicy(excluded_namespaces=args.evict_exclude_namespaces)


def scheduler_engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine configuration the flags select."""
    from cloud_core.placement.config import EngineConfig

    return EngineConfig(policy=args.placement_policy, cpsat_polish=args.exact_packing)
