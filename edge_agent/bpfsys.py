"""The agent's side of its BPF maps: the ``bpf(2)`` syscall through ctypes, no BCC.

The loader process (``python -m edge_agent.bpf_loader``) compiles and attaches
the programs and hands their file descriptors over; from then on the agent
needs only a handful of map commands (lookup, update, delete, get-next-key,
lookup-and-delete, object info), which are plain syscalls. Keys and values
are ctypes structures built from ``bpf/cfnet_links.h`` by
:func:`header_structs`, so that header stays the single definition of the
layout; each map's key and value sizes are checked against what the kernel
says they are (``BPF_OBJ_GET_INFO_BY_FD``) before the map is used.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edge_agent.errors import ProbeError

# bpf(2) syscall numbers (asm/unistd.h of each arch).
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "riscv64": 280, "ppc64le": 361,
            "s390x": 351, "i686": 357}
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_LOOKUP_AND_DELETE_ELEM = 21
BPF_MAP_LOOKUP_AND_DELETE_BATCH = 25
BPF_ANY = 0
# Errors of a command this kernel lacks for this map type (524: the kernel's ENOTSUPP).
_UNSUPPORTED = (errno.EINVAL, errno.EOPNOTSUPP, 524)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MapElemAttr(ctypes.Structure):
    """union bpf_attr, the BPF_MAP_*_ELEM member."""

    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("key", ctypes.c_uint64), ("value", ctypes.c_uint64),
                ("flags", ctypes.c_uint64)]


class _BatchAttr(ctypes.Structure):
    """union bpf_attr, the BPF_MAP_*_BATCH member (``in_batch``/``out_batch`` point at the
    map's cursor: a u32 bucket index for hash maps)."""

    _fields_ = [("in_batch", ctypes.c_uint64), ("out_batch", ctypes.c_uint64),
                ("keys", ctypes.c_uint64), ("values", ctypes.c_uint64),
                ("count", ctypes.c_uint32), ("map_fd", ctypes.c_uint32),
                ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


# Entries per batch call; grown (bounded) when one hash bucket holds more than this.
_BATCH = 64
_BATCH_MAX = 1 << 16


class _InfoAttr(ctypes.Structure):
    """union bpf_attr, the BPF_OBJ_GET_INFO_BY_FD member."""

    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64)]


class MapInfo(ctypes.Structure):
    """The leading fields of struct bpf_map_info (the kernel fills what fits)."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16)]


def _sys_bpf(cmd: int, attr: ctypes.Structure) -> int:
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        raise ProbeError(f"bpf(2) syscall number unknown on {platform.machine()}")
    ret = _libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


class _GetIdAttr(ctypes.Structure):
    """union bpf_attr, the BPF_*_GET_FD_BY_ID member."""

    _fields_ = [("id", ctypes.c_uint32), ("next_id", ctypes.c_uint32),
                ("open_flags", ctypes.c_uint32)]


def prog_alive(prog_id: int) -> bool:
    """Whether a BPF program with this id still exists anywhere in the kernel.

    A program lives while anything references it: an fd, a pinned path, or an
    attachment (a perf event holds its program). Tests use it to show that a
    killed agent's programs are gone, attachments included.
    """
    try:
        fd = _sys_bpf(BPF_PROG_GET_FD_BY_ID, _GetIdAttr(id=prog_id))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    os.close(fd)
    return True


def map_info(fd: int) -> MapInfo:
    info = MapInfo()
    attr = _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info),
                     info=ctypes.addressof(info))
    try:
        _sys_bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    except OSError as exc:
        raise ProbeError(f"map fd {fd}: BPF_OBJ_GET_INFO_BY_FD failed: {exc}") from exc
    return info


class BpfMap:
    """One hash map, by file descriptor. ``key_t``/``value_t``: ctypes types of the right size."""

    def __init__(self, fd: int, key_t: Any, value_t: Any, name: str = "") -> None:
        info = map_info(fd)
        if info.key_size != ctypes.sizeof(key_t) or info.value_size != ctypes.sizeof(value_t):
            raise ProbeError(
                f"map {name or fd}: kernel says key {info.key_size} B / value "
                f"{info.value_size} B, the header {ctypes.sizeof(key_t)} B / "
                f"{ctypes.sizeof(value_t)} B")
        self.fd = fd
        self.name = name
        self.key_t = key_t
        self.value_t = value_t
        self._lookup_and_delete = True
        self._batch = True
        self._batch_n = _BATCH

    def _elem(self, cmd: int, key: Any, value: Any = None, flags: int = 0) -> int:
        attr = _MapElemAttr(map_fd=self.fd,
                            key=ctypes.addressof(key) if key is not None else 0,
                            value=ctypes.addressof(value) if value is not None else 0,
                            flags=flags)
        return _sys_bpf(cmd, attr)

    def keys(self) -> Iterator[Any]:
        """Every key, in hash order (a key deleted meanwhile may end the walk early)."""
        prev: Any = None
        while True:
            nxt = self.key_t()
            try:
                self._elem(BPF_MAP_GET_NEXT_KEY, prev, nxt)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return
                raise
            yield nxt
            prev = nxt

    def lookup(self, key: Any) -> Any | None:
        value = self.value_t()
        try:
            self._elem(BPF_MAP_LOOKUP_ELEM, key, value)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return value

    def update(self, key: Any, value: Any) -> None:
        self._elem(BPF_MAP_UPDATE_ELEM, key, value, BPF_ANY)

    def delete(self, key: Any) -> bool:
        try:
            self._elem(BPF_MAP_DELETE_ELEM, key)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def pop(self, key: Any) -> Any | None:
        """Atomically read and delete one entry (LOOKUP_AND_DELETE, hash maps since 5.14)."""
        if self._lookup_and_delete:
            value = self.value_t()
            try:
                self._elem(BPF_MAP_LOOKUP_AND_DELETE_ELEM, key, value)
                return value
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return None
                if exc.errno not in _UNSUPPORTED:
                    raise
                self._lookup_and_delete = False  # older kernel: read, then delete
        value = self.lookup(key)
        if value is not None:
            self.delete(key)
        return value

    def drain(self) -> list[tuple[Any, Any]]:
        """Read and delete every entry; an event racing the drain lands in the next one.

        ``BPF_MAP_LOOKUP_AND_DELETE_BATCH`` (hash maps, Linux 5.6+): one system call for up
        to 64 entries, each bucket's entries copied and deleted under its lock, where the
        walk below makes two per entry (get-next-key, lookup-and-delete) and builds a key
        object for each (the agent's CPU per report). A kernel without it gets
        the walk, from then on."""
        if self._batch:
            try:
                return self._drain_batch()
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                self._batch = False
        out = []
        for key in list(self.keys()):
            value = self.pop(key)
            if value is not None:
                out.append((key, value))
        return out

    def _drain_batch(self) -> list[tuple[Any, Any]]:
        out: list[tuple[Any, Any]] = []
        cursor, nxt = ctypes.c_uint32(0), ctypes.c_uint32(0)
        first = True
        while True:
            n = self._batch_n
            keys, values = (self.key_t * n)(), (self.value_t * n)()
            attr = _BatchAttr(in_batch=0 if first else ctypes.addressof(cursor),
                              out_batch=ctypes.addressof(nxt), keys=ctypes.addressof(keys),
                              values=ctypes.addressof(values), count=n, map_fd=self.fd)
            done = False
            try:
                _sys_bpf(BPF_MAP_LOOKUP_AND_DELETE_BATCH, attr)
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # the walk's end (with the last entries)
                    done = True
                elif exc.errno == errno.ENOSPC and n < _BATCH_MAX:
                    # One bucket holds more entries than fit: again, with room for them.
                    self._batch_n = n * 4
                    continue
                else:
                    raise
            out.extend(zip(keys[:attr.count], values[:attr.count], strict=True))
            if done:
                return out
            cursor.value, first = nxt.value, False

    def clear(self) -> None:
        for key in list(self.keys()):
            self.delete(key)


# --------------------------------------------------------------------------- header

_CTYPES = {"__u8": ctypes.c_uint8, "__u16": ctypes.c_uint16, "__u32": ctypes.c_uint32,
           "__u64": ctypes.c_uint64, "__s32": ctypes.c_int32, "__s64": ctypes.c_int64,
           "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
           "u64": ctypes.c_uint64}
_STRUCT_RE = re.compile(r"struct\s+(\w+)\s*\{(.*?)\}\s*;", re.S)
_FIELD_RE = re.compile(r"^\s*(struct\s+\w+|\w+)\s+(\w+)\s*(?:\[\s*(\w+)\s*\])?\s*$")
_DEFINE_RE = re.compile(r"^#define\s+(\w+)\s+(\d+)\s*$", re.M)


def header_structs(path: Path) -> dict[str, Any]:
    """ctypes Structures for the ``struct NAME { ... };`` blocks of a C header.

    Covers what cfnet_links.h uses: fixed-width integer fields, arrays sized by
    a number or a ``#define``, and members of previously declared structs.
    Natural alignment, as clang lays them out for BPF (and ctypes on x86_64/arm64).
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProbeError(f"cannot read {path}: {exc}") from exc
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    defines = {m.group(1): int(m.group(2)) for m in _DEFINE_RE.finditer(text)}
    out: dict[str, Any] = {}
    for m in _STRUCT_RE.finditer(text):
        name, body = m.group(1), m.group(2)
        fields: list[tuple[str, Any]] = []
        for decl in body.split(";"):
            if not decl.strip():
                continue
            f = _FIELD_RE.match(decl.replace("\n", " "))
            if not f:
                raise ProbeError(f"{path.name}: struct {name}: cannot parse {decl.strip()!r}")
            typ, fname, dim = f.groups()
            base = out.get(typ.split()[1]) if typ.startswith("struct") else _CTYPES.get(typ)
            if base is None:
                raise ProbeError(f"{path.name}: struct {name}: unknown type {typ}")
            if dim is not None:
                n = int(dim) if dim.isdigit() else defines.get(dim)
                if n is None:
                    raise ProbeError(f"{path.name}: struct {name}: unknown size {dim}")
                base = base * n
            fields.append((fname, base))
        out[name] = type(name, (ctypes.Structure,), {"_fields_": fields})
    return out
