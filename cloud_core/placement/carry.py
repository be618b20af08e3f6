"""What one decision step's prepared cluster leaves the next (``place(carry=)``).

Most steps see the cluster of the step before with only the allocation and the running pods
changed: a pod bound, one gone. Preparing the snapshot afresh re-reads every node's facts in
Python (labels per filter, topology domains, taints, prices): at 1,000 nodes most of a lone
pod's step. A :class:`Carry` keeps the last step's ``PreparedCluster`` and the token its
caller gave for the nodes' facts; the next step with the same token (and the same engine
configuration) takes those indexes and filter results from it and re-reads only the nodes
whose ``NodeInfo`` changed (``index.ClusterIndex``, ``prepared.ClusterView(base=)``). The
answer is the one a fresh preparation gives: what is taken reads no allocation and no pod.

The token is the caller's word that the nodes (names, order, every field but ``allocated``)
are those of the step that gave it; ``None`` says nothing (prepared afresh). The links may
differ (their ages move with every report): what reads them (the latency arrays) is built
from each step's own snapshot.
"""

from __future__ import annotations

from collections.abc import Hashable

from .config import EngineConfig
from .engine import PreparedCluster
from .index import ClusterIndex
from .model import ClusterSnapshot


class Carry:
    """The last step's prepared cluster and its facts token (one caller's, one thread's)."""

    def __init__(self) -> None:
        self._view: PreparedCluster | None = None
        self._facts: Hashable | None = None
        self._cfg: EngineConfig | None = None
        self.taken = 0  # steps prepared on the one before (tests and stats read it)

    def prepare(self, snapshot: ClusterSnapshot, config: EngineConfig,
                facts: Hashable | None) -> PreparedCluster:
        """``snapshot`` prepared, on the last step's indexes when ``facts`` (not None) and
        ``config`` are the last step's; kept as the next step's base."""
        base = self._view if (facts is not None and facts == self._facts
                              and config == self._cfg) else None
        pc = PreparedCluster(snapshot, config, eager=False, base=base)
        if base is not None and pc.ix.pos is base.ix.pos:
            self.taken += 1
        self._view, self._facts, self._cfg = (pc, facts, config) if facts is not None \
            else (None, None, None)
        return pc

    def index(self, facts: Hashable | None) -> ClusterIndex | None:
        """The last step's node index when ``facts`` (not None) is its token, else None: a
        base for another index of the same nodes (``ClusterIndex(base=)``: the re-planner's,
        whatever its engine configuration, since the node indexes read none)."""
        if self._view is None or facts is None or facts != self._facts:
            return None
        return self._view.ix
