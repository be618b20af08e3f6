"""cfnet's client meets API Priority and Fairness as client-go does: a 429 with Retry-After is
sent again, within bounds.

Against a real kube-apiserver with APF on (the shared test control plane runs without it; this
module starts one of its own, without kube-controller-manager). A ServiceAccount's requests
are classified by a FlowSchema into a priority level with no nominal seats that rejects
rather than queues (``nominalConcurrencyShares: 0``, ``limitResponse: Reject``): APF still
lets one request in when none of the level runs, so of a burst one runs and the rest are
refused with 429 and ``Retry-After``. The fake-server table of the same path is
tests/unit/test_retry_after.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cloud_core.errors import KubeUnavailable
from cloud_core.k8s import transport
from cloud_core.k8s.client import KubeClient
from tools.envtest.harness import ControlPlane, EnvtestError

pytestmark = pytest.mark.slow

FC = "/apis/flowcontrol.apiserver.k8s.io/v1"
NS, SA = "apf-test", "throttled"


@pytest.fixture(scope="module")
def apf_plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    # control_plane: the binaries are built (and the session's plane is up anyway)
    cp = ControlPlane(controllers=False, priority_and_fairness=True)
    try:
        cp.start()
    except EnvtestError as e:
        pytest.fail(f"cannot run a control plane with APF: {e}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


def flow_schema() -> dict[str, Any]:
    return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
            "metadata": {"name": "cfnet-test-throttled"},
            "spec": {"priorityLevelConfiguration": {"name": "cfnet-test-no-seats"},
                     "matchingPrecedence": 100,
                     "distinguisherMethod": {"type": "ByUser"},
                     "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount":
                                              {"name": SA, "namespace": NS}}],
                                "nonResourceRules": [{"verbs": ["*"],
                                                      "nonResourceURLs": ["*"]}],
                                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"],
                                                   "resources": ["*"], "clusterScope": True,
                                                   "namespaces": ["*"]}]}]}}


@pytest.fixture(scope="module")
def throttled(apf_plane: ControlPlane) -> Iterator[tuple[KubeClient, KubeClient]]:
    """(admin, a client whose every request APF refuses while the FlowSchema exists)."""
    admin = KubeClient.from_kubeconfig(str(apf_plane.kubeconfig))
    admin.create(f"{FC}/prioritylevelconfigurations", {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": "cfnet-test-no-seats"},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 0, "lendablePercent": 0, "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"}}}})
    token = apf_plane.service_account_token(NS, SA)
    assert apf_plane.admin is not None
    c = KubeClient.from_token(apf_plane.admin.host, token, apf_plane.admin.ca_file)
    yield admin, c
    c.close()
    admin.close()


def _burst(c: KubeClient, n: int, retry_after: bool) -> list[tuple[int, str | None]]:
    """``n`` concurrent GETs of the OpenAPI document (tens of ms each on this server, so they
    overlap): the status of each answer, and for a 429 the Retry-After the server sent with
    the next refusal (None: none sent; "" when it served that one)."""
    out: list[tuple[int, str | None]] = []
    lock = threading.Lock()

    def one() -> None:
        status, _ = c.lean.call("GET", "/openapi/v2", None, retry_after=retry_after)
        after: str | None = ""
        if status == 429:  # ask once more, to read the header the server sends with it
            status2, _, after = c.lean._call_once("GET", "/openapi/v2", None,
                                                  "application/json", None)
            if status2 != 429:
                after = ""
        with lock:
            out.append((status, after))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(transport.RETRY_AFTER_BUDGET_S + 20)
    assert len(out) == n, "a request of the burst never returned"
    return out


def _until(c: KubeClient, retry_after: bool,
           done: Callable[[list[tuple[int, str | None]]], bool]) -> list[tuple[int, str | None]]:
    """Bursts until ``done`` (bounded: a burst whose requests did not overlap shows nothing)."""
    got: list[tuple[int, str | None]] = []
    for _ in range(10):
        got = _burst(c, 8, retry_after)
        if done(got):
            break
        time.sleep(0.5)
    return got


def test_a_burst_that_apf_refuses_is_served_in_the_end(
        throttled: tuple[KubeClient, KubeClient], monkeypatch: pytest.MonkeyPatch) -> None:
    admin, c = throttled
    admin.create(f"{FC}/flowschemas", flow_schema())
    try:
        # As the server answers: one request at a time runs on this level; the rest of a
        # burst is refused with 429 and an integer Retry-After.
        seen = _until(c, False, lambda got: any(st == 429 and a for st, a in got))
        refused = [a for st, a in seen if st == 429 and a != ""]
        assert refused, f"APF never refused the ServiceAccount's bursts: {seen}"
        assert all(a is not None and transport._retry_after_s(a) is not None
                   for a in refused), refused
        # As cfnet's client meets it: sent again after Retry-After, every request is served.
        # On one seat the resends of a burst meet again, and in the worst case one of them
        # runs per Retry-After (4 s here): a burst of 4 needs up to three waits, 12 s, past
        # the default 10 s budget. The budget is the design (the next test holds it); here
        # it is widened so that what is asserted is the resending itself, which holds
        # however the resends interleave on a loaded machine.
        monkeypatch.setattr(transport, "RETRY_AFTER_BUDGET_S", 40.0)
        got: list[tuple[int, str | None]] = []
        retried = 0
        for _ in range(10):
            before = c.lean.stats["retried"]
            got = _burst(c, 4, True)
            retried = c.lean.stats["retried"] - before
            if retried:
                break
            time.sleep(0.5)
        assert retried, "no request of the bursts was refused"
        assert [st for st, _ in got] == [200] * 4, got
    finally:
        admin.delete(f"{FC}/flowschemas/cfnet-test-throttled")


def test_a_refusal_past_the_budget_is_the_error(throttled: tuple[KubeClient, KubeClient],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The budget lowered below the server's smallest Retry-After (1 s): the first refusal is
    # the answer, raised as KubeUnavailable with its status.
    admin, c = throttled
    monkeypatch.setattr(transport, "RETRY_AFTER_BUDGET_S", 0.5)
    admin.create(f"{FC}/flowschemas", flow_schema())
    errors: list[KubeUnavailable] = []

    def get_all() -> None:
        threads = [threading.Thread(target=one, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)

    def one() -> None:
        try:
            c.get("/openapi/v2")
        except KubeUnavailable as e:
            errors.append(e)

    try:
        before = c.lean.stats["retried"]
        for _ in range(10):
            get_all()
            if errors:
                break
            time.sleep(0.5)
        assert errors and {e.status for e in errors} == {429}
        assert "Too many requests" in str(errors[0])
        assert c.lean.stats["retried"] == before  # nothing waited past the budget
    finally:
        admin.delete(f"{FC}/flowschemas/cfnet-test-throttled")
