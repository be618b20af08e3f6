"""The suite's builds (nats-server, the Kubernetes binaries, helm, the images): started before the first
test, waited for just before the first test that needs each, outside that test's timeout.

Cold, the builds take most of twenty minutes (Go from the module proxy, the images' Debian
bases); warm, each is a no-op check. They run in threads while the tests that need none of
them run: the items that need a build run last (``order``; pytest's order is kept otherwise),
and the wait is in ``pytest_runtest_protocol`` (tests/conftest.py) before pytest-timeout's
timer starts, so a long compile never counts against a test's timeout. Builds run under
``nice``: the tests come first, the build takes what they leave.

Under pytest-xdist (``make test``) the controller collects nothing: it starts every build
whose directory the run selects (``selected``) and prints their progress. A worker, before
its first item that needs a build, runs the same build itself. The build scripts hold file
locks (tools/envtest/build.sh, tools/helm/build.sh, tools/nats/build.sh, tools/images.sh), so that waits for the
controller's build and then finds everything cached.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tools import helm as chart
from tools.envtest import EnvtestError, ensure_binaries
from tools.nats.cluster import NatsError, build_nats

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "tools" / "images.sh"


def build_images(what: str = "build", stream: object = None) -> tuple[list[str], str]:
    """tools/images.sh <what> all (build: core, agent, agent-bcc; build-arm64: the arm64 core
    and agent); returns (image names, the build's tail on failure)."""
    out = stream or sys.__stderr__
    proc = subprocess.Popen(["nice", "-n", "10", "bash", str(IMAGES), what, "all"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tail: list[str] = []
    assert proc.stderr is not None and proc.stdout is not None
    for line in proc.stderr:
        print(f"[images] {line.rstrip()}", file=out, flush=True)  # type: ignore[call-overload]
        tail = [*tail[-40:], line]
    names = proc.stdout.read().split()
    return (names, "") if proc.wait() == 0 else ([], "".join(tail))


def _binaries(**what: bool) -> Callable[[], str]:
    def run() -> str:
        try:
            ensure_binaries(**what)
        except EnvtestError as e:
            return str(e)
        return ""
    return run


def _helm() -> str:
    # A failed build is reported by the tests that need helm (they call ensure_helm).
    with contextlib.suppress(chart.HelmError, subprocess.CalledProcessError):
        chart.ensure_helm()
    return ""


def _nats() -> str:
    try:
        build_nats()
    except NatsError as e:
        return str(e)
    return ""


def _images() -> str:
    # The arm64 images are a separate cached step (cold: the arm64 base's dpkg under qemu,
    # mostly CPU, and the aarch64 wheels), run beside the amd64 build, which mostly downloads
    # and writes layers.
    arm: list[str] = []
    t = threading.Thread(target=lambda: arm.append(build_images("build-arm64")[1]),
                         name="images-arm64")
    t.start()
    err = build_images()[1]
    t.join()
    return "\n".join(e for e in (err, *arm) if e)


def _uses(*fixtures: str) -> Callable[[pytest.Item], bool]:
    return lambda item: bool(set(fixtures) & set(getattr(item, "fixturenames", ())))


def _imports(package: str) -> Callable[[pytest.Item], bool]:
    """Items whose module uses something of ``package`` (a name it imported from there)."""
    def needs(item: pytest.Item) -> bool:
        module = getattr(item, "module", None)
        return module is not None and any(
            (getattr(v, "__module__", None) or getattr(v, "__name__", "") or "").startswith(
                package) for v in vars(module).values())
    return needs


def _under(*paths: str) -> Callable[[pytest.Item], bool]:
    return lambda item: any(p in item.path.as_posix() for p in paths)


@dataclass
class Build:
    """One build: what it is, which items need it, which test directories start it in the
    xdist controller, and how it runs ("" or the failure's text). State is per process."""

    what: str
    needs: Callable[[pytest.Item], bool]
    dirs: tuple[str, ...]
    run: Callable[[], str]
    thread: threading.Thread | None = field(default=None, repr=False)
    error: str = ""
    done: bool = False

    def start(self) -> None:
        """Start building in a thread (once per process)."""
        if self.thread is None and not self.done:
            self.thread = threading.Thread(target=self._run, name=f"build-{self.what}")
            self.thread.start()

    def _run(self) -> None:
        self.error = self.run()

    def wait(self) -> None:
        """Wait for this process's build; with none started (an xdist worker), run it here:
        it waits on the script's lock for the controller's build, then finds it cached."""
        if self.done:
            return
        if self.thread is None:
            self._run()
        else:
            self.thread.join()
        self.done = True

    def check(self) -> None:
        """Fail the asking test, saying why, when the build failed."""
        self.wait()
        if self.error:
            pytest.fail(f"cannot build {self.what}: {self.error}", pytrace=False)


# In the order they are needed: nats-server, helm and the control plane are short and needed
# first; the images and the real node's binaries take longest.
NATS = Build("nats-server", _imports("tools.nats"),
             ("tests/integration", "tests/unit", "tests/deploy", "tests/cluster"), _nats)
HELM = Build("helm", _under("tests/deploy/", "tests/k8s/test_manifests.py", "tests/cluster/"),
             ("tests/deploy", "tests/k8s", "tests/cluster"), _helm)
CONTROL_PLANE = Build("the Kubernetes control plane", _uses("control_plane"),
                      ("tests/k8s", "tests/deploy"), _binaries(kwok=True))
IMAGES_BUILD = Build("the images", _uses("images"), ("tests/deploy",), _images)
CLUSTER = Build("the test cluster", _uses("real_cluster", "cluster_binaries"),
                ("tests/cluster",), _binaries(node=True))
BUILDS = (NATS, HELM, CONTROL_PLANE, IMAGES_BUILD, CLUSTER)


def needed(item: pytest.Item) -> list[Build]:
    return [b for b in BUILDS if b.needs(item)]


def order(items: list[pytest.Item]) -> None:
    """Items that need no build first, then by the last build they need (stable)."""
    rank = {id(b): n + 1 for n, b in enumerate(BUILDS)}
    items.sort(key=lambda i: max((rank[id(b)] for b in needed(i)), default=0))


def selected(args: Sequence[str], rootdir: Path) -> list[Build]:
    """Builds whose directories the command line's paths select (a path above a build's
    directory, the directory itself, or a path inside it)."""
    chosen: list[Build] = []
    for b in BUILDS:
        for arg in args:
            path = Path(arg.split("::", 1)[0])
            rel = (path if not path.is_absolute() else
                   path.relative_to(rootdir) if path.is_relative_to(rootdir) else None)
            if rel is None:
                continue
            r = rel.as_posix().rstrip("/")
            if any(r in (".", "") or d == r or d.startswith(r + "/") or r.startswith(d + "/")
                   for d in b.dirs):
                chosen.append(b)
                break
    return chosen
