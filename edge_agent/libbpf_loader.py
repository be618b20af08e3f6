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
(:mod:`edge_agent.bpfsys`).

Once attached, libbpf has nothing left to do in a long-lived agent, so the descriptors are
taken from it, as the BCC loader's process hands them over (:func:`_release`): the map and
program descriptors are duplicated, each link is *disconnected* (``bpf_link__disconnect``:
destroying it then frees libbpf's memory without detaching, and leaves its descriptors
open: the BPF link's and, for a tracepoint, the perf event's it holds), the object is
closed, and when no load is running and no object is kept libbpf itself is unloaded
(``dlclose``: libbpf and libelf, ~0.4 MiB of the agent's resident memory).
Closing the handoff's descriptors then detaches, as with BCC's. The perf event's
descriptor is read from libbpf's ``struct bpf_link_perf`` (``libbpf_internal.h``, the same
from 1.0 to 1.7), checked against ``bpf_link__fd`` and the descriptor's kind; where a
check fails the object is kept, and closing the handoff destroys the links and the object
through libbpf as before.

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


class _Link(ctypes.Structure):
    """struct bpf_link (libbpf_internal.h, libbpf 1.0-1.7): read, never written."""

    _fields_ = [("detach", ctypes.c_void_p), ("dealloc", ctypes.c_void_p),
                ("pin_path", ctypes.c_void_p), ("fd", ctypes.c_int),
                ("disconnected", ctypes.c_bool)]


class _LinkPerf(ctypes.Structure):
    """The head of struct bpf_link_perf (libbpf.c): what a tracepoint attach returns."""

    _fields_ = [("link", _Link), ("perf_event_fd", ctypes.c_int)]


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
            "bpf_link__disconnect": (None, [vp]),
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
_users = 0  # loads running and objects kept: libbpf is unloaded only when there are none


def libbpf() -> _Libbpf:
    with _lib_lock:
        return _mapped()


def _mapped() -> _Libbpf:
    """libbpf, mapped if it is not (the caller holds ``_lib_lock``)."""
    global _lib
    if _lib is None:
        _lib = _Libbpf()
    return _lib


def _use(n: int) -> _Libbpf:
    """Count a user of libbpf in (+1: a load, an object kept) or out (-1). Mapping it and
    counting the user in are one step under the lock: between the two, another thread's
    :func:`_unload_if_idle` (``available()``'s, the probe's check beside an early load)
    found no user and unmapped the library this load was about to call (a segfault)."""
    global _users
    with _lib_lock:
        lib = _mapped()
        _users += n
    return lib


def _unload_if_idle() -> bool:
    """dlclose libbpf (and with it libelf) when nothing uses it; True if it was unloaded.
    Its print callback is cleared first, so a libbpf that stays mapped all the same (some
    other part of the process holds it) never calls back into freed memory."""
    global _lib
    import _ctypes

    with _lib_lock:  # held to the dlclose: no load maps and counts itself in meanwhile
        lib = _lib
        if lib is None or _users:
            return False
        _lib = None
        lib.lib.libbpf_set_print(_PRINT_FN())  # NULL: libbpf prints nothing
        handle = lib.lib._handle
        del lib
        _ctypes.dlclose(handle)
    return True


def _fd_kind(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


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
        self._kept = False  # handed to the caller: counts as a user of libbpf until closed

    def close(self) -> None:
        with self._lock:
            obj, self._obj = self._obj, None
            links, self.links = self.links, []
        if obj is None:
            return
        for link in links:
            self._lib.lib.bpf_link__destroy(link)
        self._lib.lib.bpf_object__close(obj)
        if self._kept:
            _use(-1)
            _unload_if_idle()


def _release(core: CoreObject, maps: dict[str, int], progs: dict[str, int]
             ) -> tuple[dict[str, int], dict[str, int], list[int], list[int]] | None:
    """Take the descriptors of an attached object from libbpf and close the object
    (see the module docstring): (maps, progs, links, perf events), all the caller's; None,
    with nothing changed, where libbpf's link does not read as expected."""
    L = core._lib.lib
    links: list[int] = []
    events: list[int] = []
    for link in core.links:
        view = _LinkPerf.from_address(link)
        fd = L.bpf_link__fd(link)
        if view.link.fd != fd or view.link.disconnected or fd < 0:
            return None
        perf = view.perf_event_fd
        if _fd_kind(perf) != "anon_inode:[perf_event]":
            return None
        links.append(fd)
        if perf != fd:  # a BPF link over the perf event (kernel >= 5.15); else the event
            events.append(perf)
    dup = os.dup
    own_maps = {name: dup(fd) for name, fd in maps.items()}
    own_progs = {name: dup(fd) for name, fd in progs.items()}
    with core._lock:
        obj, core._obj = core._obj, None
        held, core.links = core.links, []
    for link in held:
        L.bpf_link__disconnect(link)
        L.bpf_link__destroy(link)  # frees it; its descriptors stay open, now ours
    if obj is not None:
        L.bpf_object__close(obj)  # closes its own map and program descriptors
    return own_maps, own_progs, links, events


def load(obj_file: Path, *, config: bytes, max_entries: dict[str, int], maps: list[str]
         ) -> tuple[CoreObject | None, dict[str, int], dict[str, int], list[int], list[int]]:
    """Open, parameterise, load and attach ``obj_file``.

    ``config``: the bytes of ``struct cf_config`` for ``.rodata``; ``max_entries``: map
    sizes; ``maps``: the maps whose descriptors the caller wants. Returns (object, maps,
    progs, links, perf events): normally the object is None, libbpf is done with and the
    descriptors are the caller's to close (links first; :func:`_release`); where they
    could not be taken from libbpf, the object, which owns them: close it, not them.
    Raises ProbeError with libbpf's reason.
    """
    lib = _use(+1)
    try:
        core, map_fds, progs, links = _load(lib, obj_file, config=config,
                                            max_entries=max_entries, maps=maps)
        released = _release(core, map_fds, progs)
    except BaseException:
        _use(-1)
        _unload_if_idle()
        raise
    if released is None:
        log.info("libbpf's links not as expected: libbpf stays loaded with the object")
        core._kept = True  # this load's count passes to the object, until it is closed
        return core, map_fds, progs, links, []
    _use(-1)
    _unload_if_idle()
    return None, *released


def _load(lib: _Libbpf, obj_file: Path, *, config: bytes, max_entries: dict[str, int],
          maps: list[str]) -> tuple[CoreObject, dict[str, int], dict[str, int], list[int]]:
    btf = btf_path()
    if not btf.exists():
        raise ProbeError(f"no kernel BTF at {btf}: CO-RE cannot relocate")
    if not obj_file.is_file():
        raise ProbeError(f"CO-RE object {obj_file} not found (built by tools/build_bpf.py)")
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
    """'' if libbpf can be used here, else why not (for the loader choice's reason). Not
    kept loaded for it: the probe's check after the load would map it again for good."""
    try:
        libbpf()
    except ProbeError as exc:
        return str(exc)
    _unload_if_idle()
    return ""



def trim_heap() -> None:
    """Give the heap libbpf used back to the system (glibc's malloc_trim; else nothing).

    Relocation parses the kernel's whole BTF (~10 MiB of heap at its peak) and frees it;
    glibc keeps freed heap mapped unless asked, which a long-lived agent would carry.
    """
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)
