"""Build the agent's CO-RE BPF object: ``bpf/tcp_links.c`` -> ``bpf/obj/tcp_links.bpf.o``.

Compiled once, here, never on the device (libbpf relocates it against the device's BTF):

1. ``vmlinux.h`` from BTF with ``bpftool btf dump file <btf> format c`` (default: this
   machine's ``/sys/kernel/btf/vmlinux``; ``--btf`` another), into ``bpf/obj/`` (ignored by
   git: generated, 2.8 MB, and only the type *names* matter to CO-RE, see below);
2. ``clang -target bpf -g -O2 -DCFNET_CORE -D__TARGET_ARCH_<arch>``;
3. ``llvm-strip -g`` (DWARF out; the .BTF/.BTF.ext sections libbpf needs stay).

Make-like: nothing is done while the object is newer than its sources and this script.

**One object for amd64 and arm64.** The programs are tracepoints: they read the
tracepoint records and three kernel fields (tcp_sock.segs_out/total_retrans,
tcp_skb_cb.tcp_gso_segs in sk_buff.cb) through CO-RE relocations only, which name types
and fields and are resolved against the *device's* BTF at load. Nothing in them uses the
arch-specific parts of vmlinux.h (pt_regs, which kprobes would read through
``bpf_tracing.h``'s ``__TARGET_ARCH`` macros), and both arches are 64-bit little-endian
(``-target bpf`` is bpfel on either). ``--check-arch-neutral`` proves it for the current
sources: it compiles again with ``-D__TARGET_ARCH_arm64`` and fails unless the two objects
are byte-identical. (An arm64 vmlinux.h is not on this machine; were a program ever to read
pt_regs, that check would fail and a per-arch object built against an arm64 BTF would be
needed.)

    python -m tools.build_bpf [--out bpf/obj] [--btf PATH] [--check-arch-neutral] [--force]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC_DIR = ROOT / "bpf"
SOURCES = ("tcp_links.c", "cfnet_links.h", "cfnet_compat.h")
OBJECT = "tcp_links.bpf.o"
DEFAULT_BTF = Path("/sys/kernel/btf/vmlinux")
CFLAGS = ("-target", "bpf", "-g", "-O2", "-DCFNET_CORE", "-Wall", "-Wno-unused-function")


class BuildError(Exception):
    """A tool is missing or failed; the message says which and what it printed."""


def _tool(*names: str) -> str:
    for n in names:
        found = shutil.which(n)
        if found:
            return found
    raise BuildError(f"{names[0]} not found (tools/setup.sh installs clang, llvm and bpftool)")


def _run(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise BuildError(f"{' '.join(argv[:3])}... failed ({r.returncode}): "
                         f"{(r.stderr or r.stdout).strip()[-2000:]}")


def vmlinux_h(btf: Path, out_dir: Path) -> Path:
    """``out_dir/vmlinux.h`` from ``btf`` (regenerated when the BTF is newer)."""
    header = out_dir / "vmlinux.h"
    if not btf.exists():
        raise BuildError(f"no BTF at {btf}: the CO-RE object needs one kernel's BTF to "
                         "build against (any kernel's: relocations are by name)")
    if header.exists() and header.stat().st_size > 0:
        return header
    bpftool = _tool("bpftool")
    tmp = header.with_suffix(f".h.{os.getpid()}.tmp")  # two builds may run at once
    with tmp.open("w") as f:
        r = subprocess.run([bpftool, "btf", "dump", "file", str(btf), "format", "c"],
                           stdout=f, stderr=subprocess.PIPE, text=True, timeout=120)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"bpftool btf dump failed: {r.stderr.strip()[-500:]}")
    tmp.replace(header)
    return header


def compile_object(out: Path, include: Path, arch: str = "x86") -> None:
    clang = _tool("clang", "clang-14")
    strip = _tool("llvm-strip", "llvm-strip-14")
    raw = out.with_suffix(".debug.o")
    _run([clang, *CFLAGS, f"-D__TARGET_ARCH_{arch}", f"-I{include}", f"-I{SRC_DIR}",
          "-c", str(SRC_DIR / "tcp_links.c"), "-o", str(raw)])
    _run([strip, "-g", "-o", str(out), str(raw)])
    raw.unlink()


def up_to_date(obj: Path) -> bool:
    if not obj.exists():
        return False
    newest = max((SRC_DIR / s).stat().st_mtime for s in SOURCES)
    return obj.stat().st_mtime >= max(newest, Path(__file__).stat().st_mtime)


def build(out_dir: Path, btf: Path = DEFAULT_BTF, force: bool = False) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    obj = out_dir / OBJECT
    if not force and up_to_date(obj):
        return obj
    include = vmlinux_h(btf, out_dir).parent
    tmp = obj.with_suffix(f".{os.getpid()}.tmp.o")  # two builds may run at once
    compile_object(tmp, include)
    os.replace(tmp, obj)
    return obj


def check_arch_neutral(out_dir: Path, btf: Path = DEFAULT_BTF) -> None:
    """Compile for x86 and arm64 against the same vmlinux.h; they must be identical."""
    include = vmlinux_h(btf, out_dir).parent
    with tempfile.TemporaryDirectory() as d:
        x86, arm = Path(d, "x86.o"), Path(d, "arm64.o")
        compile_object(x86, include, "x86")
        compile_object(arm, include, "arm64")
        if not filecmp.cmp(x86, arm, shallow=False):
            raise BuildError("the x86 and arm64 builds differ: the programs use arch-specific "
                             "types; build the arm64 object against an arm64 vmlinux.h")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.build_bpf", description=__doc__.split(
        "\n", 1)[0])
    p.add_argument("--out", type=Path, default=SRC_DIR / "obj")
    p.add_argument("--btf", type=Path, default=DEFAULT_BTF)
    p.add_argument("--force", action="store_true")
    p.add_argument("--check-arch-neutral", action="store_true")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    try:
        obj = build(a.out, a.btf, a.force)
        if a.check_arch_neutral:
            check_arch_neutral(a.out, a.btf)
    except BuildError as exc:
        print(f"build_bpf: {exc}", file=sys.stderr)
        return 1
    print(f"build_bpf: {obj} ({obj.stat().st_size} bytes, {time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
