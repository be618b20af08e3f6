"""Fixtures for the packaging tests: helm and the images, built before the tests that need
them (tests/envbuild.py: a cold build does not count against a test's timeout; progress goes
to the terminal). Everything is cached outside the repository (tools/helm/build.sh,
tools/images.sh), so a warm run builds nothing.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.envbuild import IMAGES_BUILD

# The real control plane of the Kubernetes tests (one more instance for this directory): the
# core image is run against it as the chart runs it.
from tests.k8s.conftest import control_plane  # noqa: F401
from tools import helm as chart

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def images(request: pytest.FixtureRequest) -> dict[str, str]:
    """Names of the images built from the Containerfile: core, agent (CO-RE), agent-bcc,
    core-arm64 and agent-arm64."""
    IMAGES_BUILD.check()
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
