"""Fixtures for the packaging tests: helm and the two images, built before any test runs.

Builds happen at collection (as tests/k8s does for the control plane) so that a cold build —
helm from the Go module proxy, the mmdebstrap base, two `podman build`s — does not count
against a test's timeout; progress goes to the terminal. Everything is cached outside the
repository (tools/helm/build.sh, tools/images.sh), so a warm run builds nothing.
"""

from __future__ import annotations

import contextlib
import resource
import shutil
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest

# The real control plane of the Kubernetes tests (one more instance for this directory): the
# core image is run against it as the chart runs it.
from tests.k8s.conftest import control_plane  # noqa: F401
from tools import helm as chart

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "tools" / "images.sh"
IMAGE_ERROR = pytest.StashKey[str]()
# Tests that need the built helm, wherever they live.
_HELM_USERS = ("tests/deploy/", "tests/k8s/test_manifests.py")


def _selected(items: list[pytest.Item], *parts: str) -> bool:
    return any(p in str(i.path) for i in items for p in parts)


def build_images(stream: object = None, what: str = "build") -> tuple[list[str], str]:
    """tools/images.sh <what> all (build: core, agent, agent-bcc; build-arm64: the arm64 core
    and agent); returns (image names, the build's tail on failure)."""
    out = stream or sys.__stderr__
    proc = subprocess.Popen(["nice", "-n", "10", "bash", str(IMAGES), what, "all"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tail: list[str] = []
    assert proc.stderr is not None and proc.stdout is not None
    for line in proc.stderr:
        print(f"[images] {line.rstrip()}", file=out, flush=True)  # type: ignore[call-overload]
        tail = [*tail[-40:], line]
    names = proc.stdout.read().split()
    return (names, "") if proc.wait() == 0 else ([], "".join(tail))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # helm compiles (CPU) while the images mostly download and write layers (network, disk):
    # cold, the two together take about as long as the longer one.
    helm_build = None
    if _selected(items, *_HELM_USERS):
        # A failed build is reported by the tests that need helm (they call ensure_helm).
        def build_helm() -> None:
            with contextlib.suppress(chart.HelmError, subprocess.CalledProcessError):
                chart.ensure_helm()

        helm_build = threading.Thread(target=build_helm, name="helm-build")
        helm_build.start()
    if _selected(items, "tests/deploy/test_images.py"):
        # The arm64 images are a separate cached step (cold: the arm64 base's dpkg under qemu,
        # mostly CPU, and the aarch64 wheels; warm: a no-op check), run beside the amd64 build,
        # which mostly downloads and writes layers.
        arm_err: list[str] = []

        def build_arm64() -> None:
            _n, e = build_images(what="build-arm64")
            arm_err.append(e)

        arm = threading.Thread(target=build_arm64, name="images-arm64")
        arm.start()
        _names, err = build_images()
        arm.join()
        err = "\n".join(e for e in (err, *arm_err) if e)
        if err:
            config.stash[IMAGE_ERROR] = err
    if helm_build is not None:
        helm_build.join()


@pytest.fixture(scope="session")
def images(request: pytest.FixtureRequest) -> dict[str, str]:
    """Names of the images built from the Containerfile: core, agent (CO-RE), agent-bcc,
    core-arm64 and agent-arm64."""
    err = request.config.stash.get(IMAGE_ERROR, None)
    if err is not None:
        pytest.fail(f"building the images failed (tools/images.sh build all):\n{err}",
                    pytrace=False)
    tag = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return {t: f"localhost/cfnet-{t}:{tag}"
            for t in ("core", "agent", "agent-bcc", "core-arm64", "agent-arm64")}


def podman_run_flags() -> list[str]:
    """What `podman run` needs on this machine, and why.

    * ``--runtime runc``: crun (podman's default) refuses the cgroup v1 + v2 hybrid this kernel
      is booted with ("cgroups in hybrid mode not supported, drop all controllers from
      cgroupv2"); runc runs containers under the v1 controllers.
    * ``--ulimit``: podman asks for RLIMIT_NOFILE/NPROC of 1048576 in root containers; this
      machine's root lacks CAP_SYS_RESOURCE ("setrlimit RLIMIT_NOFILE: Operation not
      permitted"), so the containers keep the limits the caller already has.
    """
    flags = []
    if shutil.which("runc"):
        flags += ["--runtime", shutil.which("runc") or "runc"]
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    flags += ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=4096:4096"]
    return flags


@pytest.fixture(scope="module")
def helm_built() -> None:
    """The chart tests' helm (tools/helm/build.sh; cached): a failed build fails them, saying why."""
    try:
        chart.ensure_helm()
    except (chart.HelmError, subprocess.CalledProcessError) as e:
        pytest.fail(f"cannot build helm: {e}", pytrace=False)
