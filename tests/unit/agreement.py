"""One check for every case taken from kube-scheduler's plugin tests: the engine, the validator
and ``explain`` give the same answer on every node ("explain agrees with the validator
on every node in those tests").

The validator (``validate``, which the core runs before it binds) is the reference: a node it
accepts must be one ``explain`` says "fits" of, a node it rejects one ``explain`` gives a reason
for; ``explain``'s tally (``fit`` of ``total``) must count the same nodes; and the engine's own
choice, when it makes one, is a node the validator accepts (none when no node is accepted).
Used by tests/unit/test_upstream_plugins.py, test_k8s_semantics.py, test_bounds.py and
placement/test_interpod_scoring.py.
"""

from __future__ import annotations

from cloud_core.placement import ClusterSnapshot, EngineConfig, Workload, explain, place, validate


def fitting_nodes(snap: ClusterSnapshot, w: Workload,
                  config: EngineConfig | None = None) -> set[str]:
    """The nodes ``w`` fits on, after checking that the engine, the validator and
    ``explain`` agree on each of them (an AssertionError names the node and both answers)."""
    by_validator: set[str] = set()
    for n in snap.nodes:
        violations = validate(snap, [w], {w.uid: n.name})
        reasons = explain(snap, w, config, node=n.name).node_reasons
        assert (not violations) == (not reasons), (
            f"{w.uid} on {n.name}: validator says "
            f"{[f'{v.constraint}: {v.detail}' for v in violations] or 'fits'}, explain says "
            f"{list(reasons) or 'fits'}")
        if not violations:
            by_validator.add(n.name)
    whole = explain(snap, w, config)
    assert (whole.fit, whole.total) == (len(by_validator), len(snap.nodes)), (
        f"explain's tally {whole.summary!r}, the validator accepts {sorted(by_validator)}")
    got = place(snap, [w], config).assignments.get(w.uid)
    if by_validator:
        assert got in by_validator, (f"the engine chose {got!r}, the validator accepts "
                                     f"{sorted(by_validator)}")
    else:
        assert got is None, f"the engine chose {got!r}, which the validator rejects"
    return by_validator
