"""`cfnet-core --kubernetes` as the chart runs it (the installed entry point, a real API
server, a real Mosquitto): `/healthz`, `/readyz` and the metrics the chart's probes and
ServiceMonitor read. A core that loses its broker or its API server turns not-ready, and
ready again when they return; `--lease-name` is the Lease it holds; `--log-format json`
writes JSON lines."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from cloud_core.k8s.client import KubeClient
from tests.k8s.conftest import Cluster, wait_for
from tools.broker import Broker, free_port
from tools.envtest import ControlPlane
from tools.procs import stop_all


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()
    except OSError as e:
        return 0, str(e)


def core_command() -> list[str]:
    """The installed console script, as the image's entrypoint runs it."""
    exe = Path(sys.executable).parent / "cfnet-core"
    return [str(exe)] if exe.exists() else [shutil.which("cfnet-core") or "cfnet-core"]


def test_readyz_follows_broker_and_api_server(control_plane: ControlPlane, admin: KubeClient,
                                               cluster: Cluster,
                                               broker_factory: Callable[..., Broker],
                                               tmp_path: Path) -> None:
    broker = broker_factory()
    creds = broker.add_account("core-k8s", "core")
    assert creds.ca_file is not None
    (tmp_path / "pw").write_text(creds.password)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    err = open(tmp_path / "core.stderr", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*core_command(), "--kubernetes", "--kubeconfig", str(control_plane.kubeconfig),
         "--identity", "core-probe", "--lease-namespace", cluster.namespace,
         "--lease-name", "probe-lease", "--lease-duration", "3",
         "--broker-host", "127.0.0.1", "--broker-port", str(broker.port),
         "--username", "core-k8s", "--password-file", str(tmp_path / "pw"),
         "--ca-file", str(creds.ca_file), "--db", str(tmp_path / "core.db"),
         "--metrics-port", str(port), "--table-every", "0", "--log-format", "json"],
        stdout=subprocess.DEVNULL, stderr=err)
    api_down = False

    def ready() -> bool:
        return get(f"{base}/readyz")[0] == 200

    def not_ready(check: str) -> Callable[[], str | None]:
        def pred() -> str | None:
            code, body = get(f"{base}/readyz")
            return body if code == 503 and f"[-]{check}:" in body else None
        return pred

    try:
        wait_for(ready, timeout=60, every=0.3, what="/readyz 200 (leading, synced, connected)")
        assert get(f"{base}/readyz")[1].splitlines() == [
            "[+]startup ok", "[+]broker ok", "[+]kubernetes-caches ok", "[+]kubernetes-api ok",
            "ok"]
        assert get(f"{base}/healthz") == (200, "ok\n")
        code, metrics = get(f"{base}/metrics")
        assert code == 200
        assert "cfnet_leader 1.0" in metrics
        assert 'cfnet_build_info{python="' in metrics and 'version="0.1.0"' in metrics
        assert "process_resident_memory_bytes" in metrics
        # every list page and watch event so far fitted the lean schemas (k8s/objects.py)
        assert 'cfnet_kube_decode_total{what="fallback"} 0' in metrics, \
            [ln for ln in metrics.splitlines() if "decode" in ln]
        lease = admin.get(f"/apis/coordination.k8s.io/v1/namespaces/{cluster.namespace}/"
                          "leases/probe-lease")
        assert lease["spec"]["holderIdentity"] == "core-probe"

        # The broker goes: not ready, naming it; back: ready again (the core reconnects).
        broker.kill()
        body = wait_for(not_ready("broker"), timeout=20, every=0.3,
                        what="/readyz 503 naming the broker after the broker died")
        assert "readyz check failed" in body
        assert get(f"{base}/healthz")[0] == 200  # alive: no restart for a broker outage
        broker.start()
        wait_for(ready, timeout=60, every=0.3, what="/readyz 200 after the broker returned")

        # The API server goes: not ready within about one lease duration; back: ready.
        control_plane.stop_apiserver()
        api_down = True
        body = wait_for(not_ready("kubernetes-api"), timeout=30, every=0.3,
                        what="/readyz 503 naming the API server after it stopped")
        control_plane.start_apiserver()
        api_down = False
        wait_for(ready, timeout=90, every=0.3, what="/readyz 200 after the API server returned")
    finally:
        if api_down:
            control_plane.start_apiserver()
        stop_all([proc], grace_s=20)
        err.close()
    lines = [ln for ln in (tmp_path / "core.stderr").read_text().splitlines() if ln.strip()]
    assert lines, "the core wrote no log"
    for ln in lines:
        rec = json.loads(ln)  # every line one JSON object
        assert {"ts", "level", "logger", "msg"} <= set(rec)
    assert any("placing through the Kubernetes API" in json.loads(ln)["msg"] for ln in lines)
