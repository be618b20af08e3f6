"""Building the test cluster's Go binaries in a thread during collection, for the conftests
of tests/k8s and tests/cluster (each with its own ``EnvBuild``: they build different sets).

At collection, not in a fixture, so that a first, long compile does not count against the
per-test timeout; in a thread, started first and joined when collection finishes, so that the
packaging tests' own builds (helm, the images: tests/deploy/conftest.py) run beside it.
"""

from __future__ import annotations

import threading

import pytest

from tools.envtest import EnvtestError, ensure_binaries


class EnvBuild:
    """One background ``ensure_binaries(**what)``: its thread and its error in the config's
    stash."""

    def __init__(self, what: str, **ensure: bool) -> None:
        self.what = what
        self.ensure = ensure
        self.error_key = pytest.StashKey[str]()
        self.thread_key = pytest.StashKey[threading.Thread]()

    def start(self, config: pytest.Config) -> None:
        """Start building (progress goes straight to the terminal)."""
        def build() -> None:
            try:
                ensure_binaries(**self.ensure)
            except EnvtestError as e:
                config.stash[self.error_key] = str(e)

        thread = threading.Thread(target=build, name=f"envtest-build-{self.what}")
        thread.start()
        config.stash[self.thread_key] = thread

    def join(self, session: pytest.Session) -> None:
        """Wait for the build started by ``start`` (none: nothing to wait for)."""
        thread = session.config.stash.get(self.thread_key, None)
        if thread is not None:
            thread.join()

    def check(self, config: pytest.Config) -> None:
        """Fail the asking test, saying why, when the build failed."""
        err = config.stash.get(self.error_key, None)
        if err is not None:
            pytest.fail(f"cannot build {self.what}: {err}", pytrace=False)
