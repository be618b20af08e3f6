"""Where a batch's anchors go first: the pods that other classes of the same batch follow by
required pod affinity.

The engine places a batch in rounds: a class whose required pod affinity selects pods of
another class of the batch waits for that class (its anchor) to be placed, and may then use
only the domains (zones, hosts, ...) where an anchor pod ended up. Placed by cost alone, an
anchor's pods gather in the cheapest domains, which are often not where its followers may go
(their residency, node affinity, taints, latency SLAs confine them elsewhere): they are left
out although a node that passes every other filter has room for them.

``anchor_domains`` picks, before the anchor's round, one domain per anchor pod (at most as
many as it has pods) by weighted coverage: each pick is the domain, among those with a node
the anchor may use and has room on, where the most follower pods not yet covered may go
(their nodes by every filter but pod affinity; per follower at most the pods of its shape
the domain's free room holds, its free pod slots, extended resources and host ports
included, and at most its ``per_domain`` pods: a follower with a hard
spread over the same topology key takes ``max_skew`` pods per domain, as the domains it may
use but no anchor is in stay empty). A follower's pods are covered as picks (or running pods
it follows) take them; a follower without spread is covered once one domain it follows is.
The engine places one anchor pod in each picked domain first, the cheapest node there, then
the rest of the batch as before. Pure arithmetic on masks: no CP-SAT, a few numpy calls per
anchor and follower.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .classes import capacity_per_node, has_room
from .model import PodAffinityTerm

# per class, its required pod-affinity terms and the batch classes each may select
Deps = Mapping[int, list[tuple[PodAffinityTerm, set[int]]]]


def followers(deps: Deps, anchor: int, waiting: set[int]) -> list[tuple[int, str]]:
    """The waiting classes with a term that ``anchor`` may satisfy, and that term's
    topology key (the first such term of each)."""
    out = []
    for ci in sorted(waiting):
        for t, ms in deps.get(ci, []):
            if anchor in ms and ci != anchor:
                out.append((ci, t.topology_key))
                break
    return out


def anchor_domains(anchor_mask: np.ndarray, anchor_req: np.ndarray, pods: int,
                   dom: np.ndarray, free: np.ndarray,
                   follow: Sequence[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]],
                   covered: Sequence[np.ndarray],
                   per_domain: Sequence[int] | None = None) -> list[int]:
    """The domains (ids of ``dom``, a node's domain, -1 none) to put one anchor pod each in,
    best first, at most ``pods``. ``follow``: per follower class (pods, its mask by every
    filter but pod affinity, its request vector); ``covered``: per follower, a boolean per
    domain where a running pod it follows already is (the domain counts as covered);
    ``per_domain``: per follower, the most of its pods one domain takes (default: all)."""
    n_dom = int(dom.max(initial=-1)) + 1
    if n_dom <= 1 or pods <= 0 or not follow:
        return []
    ok = anchor_mask & has_room(anchor_req, free) & (dom >= 0)
    may = np.zeros(n_dom, dtype=bool)
    may[dom[ok]] = True
    # per follower and domain, how many of its pods the domain's free room holds, and at
    # most its pods per domain; per follower, its pods not yet covered
    value = np.zeros((len(follow), n_dom), dtype=np.int64)
    rem = np.zeros(len(follow), dtype=np.int64)
    for j, (count, mask, req, room) in enumerate(follow):
        cap = count if per_domain is None else max(min(per_domain[j], count), 1)
        fits = mask & (dom >= 0)
        held = capacity_per_node(req, free[fits])
        if room is not None:
            held = np.minimum(held, room[fits])
        value[j] = np.minimum(np.bincount(dom[fits], minlength=n_dom, weights=held
                                          ).astype(np.int64), cap)
        if cap >= count:  # no spread: one covered domain is enough
            rem[j] = 0 if (value[j] > 0)[covered[j]].any() else count
        else:
            rem[j] = max(count - cap * int(covered[j].sum()), 0)
    picks: list[int] = []
    while len(picks) < pods:
        take = np.minimum(value, rem[:, None])
        gain = take.sum(axis=0) * may
        if not gain.any():
            break
        d = int(np.argmax(gain))  # ties: the lowest id, deterministic
        picks.append(d)
        may[d] = False
        rem -= take[:, d]
    return picks


def domains_of(dom: np.ndarray, nodes: Sequence[int]) -> np.ndarray:
    """A boolean per domain of ``dom``: does one of ``nodes`` lie in it."""
    out = np.zeros(int(dom.max(initial=-1)) + 1, dtype=bool)
    for n in nodes:
        if n >= 0 and dom[n] >= 0:
            out[dom[n]] = True
    return out


__all__ = ["Deps", "anchor_domains", "domains_of", "followers"]
