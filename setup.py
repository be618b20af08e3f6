"""Build hook: building cfnet (a wheel, an sdist's wheel, an editable install) compiles the
agent's CO-RE object first, so the package carries ``edge_agent/bpf/obj/tcp_links.bpf.o``
and ``pip install`` on a device runs the CO-RE loader with no compiler there.

Everything else about the package is in pyproject.toml; this file only adds the step. The
compile is ``tools/build_bpf.py``'s (clang, llvm-strip and bpftool on the build machine,
any kernel's BTF: relocations are by name), make-like: an object newer than its sources is
kept. Where no compiler is found but an object is already there (an image build, which
copies the host's), that object is packaged as is, and the build says so. Where neither,
the build fails and says what to install: a wheel without the object would make every
device that installs it fall back to a compiler, the thing the CO-RE agent exists to avoid.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithBpf(build_py):
    """``build_py`` that builds the CO-RE object before it collects the package data."""

    def run(self) -> None:
        sys.path.insert(0, str(ROOT))
        try:
            from tools.build_bpf import OBJECT, SRC_DIR, BuildError, build
        finally:
            sys.path.remove(str(ROOT))
        obj = SRC_DIR / "obj" / OBJECT
        try:
            built = build(SRC_DIR / "obj")
            print(f"cfnet: CO-RE object {built} ({built.stat().st_size} bytes)")
        except BuildError as exc:
            if not obj.is_file():
                raise SystemExit(
                    f"cfnet: cannot build the agent's CO-RE object {obj}: {exc}. Install "
                    "clang, llvm and bpftool on the build machine (tools/setup.sh does), or "
                    "put a prebuilt object there (python -m tools.build_bpf)") from exc
            print(f"cfnet: packaging the existing CO-RE object {obj} as is ({exc})")
        # Package data is listed lazily, but drop any list made before the object existed.
        self.__dict__.pop("data_files", None)
        super().run()


setup(cmdclass={"build_py": BuildWithBpf})
