"""Kwok.start retries a kwok that dies while starting (kwok v0.8.0's start-up race), and
gives up after three starts. ``_start_once`` is replaced by a fake (named so): the real
start is run by every tests/k8s session."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tools.envtest import kwok as kwok_mod


def _kwok(tmp_path: Path, fails: int) -> tuple[kwok_mod.Kwok, list[int]]:
    k = kwok_mod.Kwok(SimpleNamespace(dir=tmp_path))  # type: ignore[arg-type]
    starts: list[int] = []

    def fake_start_once() -> None:
        starts.append(1)
        if len(starts) <= fails:
            raise kwok_mod._KwokExited("kwok exited (2):\nfatal error: concurrent map writes")

    k._start_once = fake_start_once  # type: ignore[method-assign]
    return k, starts


def test_a_kwok_that_dies_starting_is_started_again(tmp_path: Path) -> None:
    k, starts = _kwok(tmp_path, fails=2)
    k.start()
    assert len(starts) == 3


def test_three_deaths_are_an_error(tmp_path: Path) -> None:
    k, starts = _kwok(tmp_path, fails=3)
    with pytest.raises(kwok_mod.EnvtestError, match="concurrent map writes"):
        k.start()
    assert len(starts) == 3
