"""CO-RE loader: the prebuilt ``tcp_links.bpf.o`` loaded by libbpf, in the agent's process.

The object is compiled once at build time (``tools/build_bpf.py``: clang against a
bpftool-generated vmlinux.h) and ships as package data; no compiler runs on the device.
Debian's ``libbpf1`` (``libbpf.so.1``) is called through ctypes, the way a libbpf-tools
program would use its skeleton:

1. ``bpf_object__open_file`` parses the ELF (BTF, maps, programs);
2. parameters go into ``.rodata`` (``struct cf_config``, the only thing there) through
   ``bpf_map__initial_value``, map sizes through ``bpf_map__set_max_entries``;
3. ``bpf_object__load`` applies the CO-RE relocations against the running kernel's BTF
   and loads; the verifier sees the parameters as constants;
4. ``bpf_program__attach`` attaches each tracepoint program.

The result is a :class:`~edge_agent.bpf_loader.Handoff` like the BCC loader's: the map,
program and attachment descriptors, which the agent reads with ``bpf(2)``
(:mod:`edge_agent.bpfsys`). Closing it destroys the links and the object (detach, free).

No separate process: libbpf is 0.4 MiB mapped and a load takes tens of milliseconds, so
none of the reasons the BCC loader has one (LLVM mapped, a compile of seconds) apply.

Test seam: ``CFNET_BTF_PATH`` names the kernel BTF to relocate against (default
``/sys/kernel/btf/vmlinux``). A path that does not exist makes this loader refuse as a
kernel without BTF would, which is how the tests reach the BCC fallback on a machine that
has BTF.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any

from edge_agent.errors import ProbeError

log = logging.getLogger(__name__)

ENV_BTF = "CFNET_BTF_PATH"
DEFAULT_BTF = "/sys/kernel/btf/vmlinux"
OBJECT = "tcp_links.bpf.o"
LIBBPF_SONAME = "libbpf.so.1"


def btf_path() -> Path:
    """The kernel BTF CO-RE relocates against ($CFNET_BTF_PATH, a test seam)."""
    return Path(os.environ.get(ENV_BTF) or DEFAULT_BTF)


def object_path(bpf_dir: Path) -> Path:
    """Where the prebuilt object lives: ``<bpf dir>/obj/tcp_links.bpf.o``."""
    return bpf_dir / "obj" / OBJECT


class _OpenOpts(ctypes.Structure):
    """The leading fields of struct bpf_object_open_opts (libbpf.h, 1.x); ``sz`` tells
    libbpf how much of it we pass."""

    _fields_ = [("sz", ctypes.c_size_t), ("object_name", ctypes.c_char_p),
                ("relaxed_maps", ctypes.c_bool), ("pin_root_path", ctypes.c_char_p),
                ("_attach_prog_fd", ctypes.c_uint32), ("kconfig", ctypes.c_char_p),
                ("btf_custom_path", ctypes.c_char_p)]


_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_LIBBPF_WARN, _LIBBPF_INFO = 0, 1


class _Libbpf:
    """libbpf.so.1's functions with their signatures; its messages kept for errors."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL(LIBBPF_SONAME, use_errno=True)
        except OSError as exc:
            raise ProbeError(f"libbpf not available ({LIBBPF_SONAME}: {exc}); "
                             "install Debian's libbpf1") from exc
        vp, cp, ci = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        sigs: dict[str, tuple[Any, list[Any]]] = {
            "bpf_object__open_file": (vp, [cp, vp]),
            "bpf_object__load": (ci, [vp]),
            "bpf_object__close": (None, [vp]),
            "bpf_object__find_map_by_name": (vp, [vp, cp]),
            "bpf_object__next_program": (vp, [vp, vp]),
            "bpf_map__set_max_entries": (ci, [vp, ctypes.c_uint32]),
            "bpf_map__initial_value": (vp, [vp, ctypes.POINTER(ctypes.c_size_t)]),
            "bpf_map__fd": (ci, [vp]),
            "bpf_program__name": (cp, [vp]),
            "bpf_program__fd": (ci, [vp]),
            "bpf_program__attach": (vp, [vp]),
            "bpf_link__fd": (ci, [vp]),
            "bpf_link__destroy": (ci, [vp]),
            "libbpf_set_print": (vp, [_PRINT_FN]),
        }
        for name, (res, args) in sigs.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as exc:
                raise ProbeError(f"{LIBBPF_SONAME} lacks {name} (libbpf >= 1.0 needed)") from exc
            fn.restype, fn.argtypes = res, args
        self.lib = lib
        self.messages: deque[str] = deque(maxlen=64)
        libc = ctypes.CDLL(None)
        vsnprintf = libc.vsnprintf
        vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]

        def on_print(level: int, fmt: bytes, ap: int) -> int:
            # va_list is a pointer on x86_64 and (a >16-byte struct, passed by reference) on
            # aarch64, so it goes through to vsnprintf as one.
            if level > _LIBBPF_INFO:
                return 0
            buf = ctypes.create_string_buffer(1024)
            vsnprintf(buf, len(buf), fmt, ap)
            text = buf.value.decode(errors="replace").rstrip()
            if text:
                self.messages.append(text)
            return 0

        self._print = _PRINT_FN(on_print)  # kept: libbpf holds the pointer
        lib.libbpf_set_print(self._print)

    def recent(self, n: int = 6) -> str:
        """libbpf's last messages (the verifier's or relocation's complaint), one line."""
        return " | ".join(list(self.messages)[-n:])


_lib: _Libbpf | None = None
_lib_lock = threading.Lock()


def libbpf() -> _Libbpf:
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _Libbpf()
        return _lib


def _err(ret: int | None) -> str:
    code = -ret if ret and ret < 0 else ctypes.get_errno()
    return os.strerror(code) if code else "unknown error"


class CoreObject:
    """One loaded and attached object; :meth:`close` detaches and frees it (idempotent)."""

    def __init__(self, lib: _Libbpf, obj: int) -> None:
        self._lib = lib
        self._obj: int | None = obj
        self.links: list[int] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            obj, self._obj = self._obj, None
            links, self.links = self.links, []
        if obj is None:
            return
        for link in links:
            self._lib.lib.bpf_link__destroy(link)
        self._lib.lib.bpf_object__close(obj)


def load(obj_file: Path, *, config: bytes, max_entries: dict[str, int],
         maps: list[str]) -> tuple[CoreObject, dict[str, int], dict[str, int], list[int]]:
    """Open, parameterise, load and attach ``obj_file``.

    ``config``: the bytes of ``struct cf_config`` for ``.rodata``; ``max_entries``: map
    sizes; ``maps``: the maps whose descriptors the caller wants. Returns the object and
    (maps, progs, links) descriptors, which stay the object's: close the object, not them.
    Raises ProbeError with libbpf's reason.
    """
    btf = btf_path()
    if not btf.exists():
        raise ProbeError(f"no kernel BTF at {btf}: CO-RE cannot relocate")
    if not obj_file.is_file():
        raise ProbeError(f"CO-RE object {obj_file} not found (built by tools/build_bpf.py)")
    lib = libbpf()
    L = lib.lib
    opts = _OpenOpts(sz=ctypes.sizeof(_OpenOpts))
    if str(btf) != DEFAULT_BTF:
        opts.btf_custom_path = str(btf).encode()
    ctypes.set_errno(0)
    obj = L.bpf_object__open_file(str(obj_file).encode(), ctypes.byref(opts))
    if not obj:
        raise ProbeError(f"libbpf cannot open {obj_file.name}: {_err(None)}; {lib.recent()}")
    core = CoreObject(lib, obj)
    try:
        rodata = L.bpf_object__find_map_by_name(obj, b".rodata")
        if not rodata:
            raise ProbeError(f"{obj_file.name} has no .rodata (parameters)")
        size = ctypes.c_size_t(0)
        ptr = L.bpf_map__initial_value(rodata, ctypes.byref(size))
        if not ptr or size.value != len(config):
            # Anything else the compiler put in .rodata would shift cf_cfg: refuse rather
            # than write the parameters over it.
            raise ProbeError(f".rodata is {size.value} bytes, struct cf_config {len(config)}")
        ctypes.memmove(ptr, config, len(config))
        for name, n in max_entries.items():
            m = L.bpf_object__find_map_by_name(obj, name.encode())
            if not m or L.bpf_map__set_max_entries(m, n) != 0:
                raise ProbeError(f"cannot size map {name} to {n}")
        ret = L.bpf_object__load(obj)
        if ret != 0:
            raise ProbeError(f"libbpf load failed: {_err(ret)}; {lib.recent()}")
        map_fds: dict[str, int] = {}
        for name in maps:
            m = L.bpf_object__find_map_by_name(obj, name.encode())
            fd = L.bpf_map__fd(m) if m else -1
            if fd < 0:
                raise ProbeError(f"map {name} missing from {obj_file.name}")
            map_fds[name] = fd
        progs: dict[str, int] = {}
        prog = L.bpf_object__next_program(obj, None)
        while prog:
            name = (L.bpf_program__name(prog) or b"?").decode()
            ctypes.set_errno(0)
            link = L.bpf_program__attach(prog)
            if not link:
                raise ProbeError(f"attaching {name} failed: {_err(None)}; {lib.recent()}")
            core.links.append(link)
            progs[name] = L.bpf_program__fd(prog)
            prog = L.bpf_object__next_program(obj, prog)
        links = [L.bpf_link__fd(link) for link in core.links]
    except BaseException:
        core.close()
        raise
    return core, map_fds, progs, links


def available() -> str:
    """'' if libbpf can be used here, else why not (for the loader choice's reason)."""
    try:
        libbpf()
    except ProbeError as exc:
        return str(exc)
    return ""



def trim_heap() -> None:
    """Give the heap libbpf used back to the system (glibc's malloc_trim; else nothing).

    Relocation parses the kernel's whole BTF (~10 MiB of heap at its peak) and frees it;
    glibc keeps freed heap mapped unless asked, which a long-lived agent would carry.
    """
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)
