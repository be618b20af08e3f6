"""Member offsets of kernel structs, read from the running kernel's BTF.

Used by the BCC loader only (the CO-RE object has libbpf relocate its reads).
The BPF programs read three kernel fields no tracepoint gives: tcp_sock's
segs_out and total_retrans, and how many segments a retransmitted skb carries
(``tcp_skb_pcount``). Their offsets must come from the *running*
kernel, never from the headers BCC compiles against (setup may link the
nearest Debian headers, which belong to another kernel). ``/sys/kernel/btf/vmlinux``
describes the running kernel's types; this is the small part of the format
(kernel Documentation/bpf/btf.rst) needed to find a member's byte offset,
descending into anonymous structs and unions.
"""

from __future__ import annotations

import struct
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
_MAGIC = 0xEB9F
_STRUCT, _UNION = 4, 5
_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG = 8, 9, 10, 11, 18
# Bytes that follow struct btf_type, per kind: fixed, and per vlen entry.
_EXTRA_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}
_EXTRA_PER_VLEN = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}
_MODIFIERS = {_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG}


class BtfError(Exception):
    """The BTF blob is unreadable or lacks the struct/member asked for."""


class Btf:
    """Type table of one BTF blob (names resolved lazily)."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 24:
            raise BtfError("BTF blob too short")
        magic, _ver, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(
            "<HBBIIIII", data, 0)
        if magic != _MAGIC:
            raise BtfError(f"bad BTF magic {magic:#x}")
        self._data = data
        self._strs = hdr_len + str_off
        self._str_end = self._strs + str_len
        # types[id] = (kind, name_off, vlen, kind_flag, size_or_type, offset of its extra data)
        self._types: list[tuple[int, int, int, int, int, int]] = [(0, 0, 0, 0, 0, 0)]
        p, end = hdr_len + type_off, hdr_len + type_off + type_len
        if end > len(data) or self._str_end > len(data):
            raise BtfError("BTF sections run past the blob")
        while p < end:
            name_off, info, size = struct.unpack_from("<III", data, p)
            kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
            p += 12
            self._types.append((kind, name_off, vlen, kflag, size, p))
            p += _EXTRA_FIXED.get(kind, 0) + _EXTRA_PER_VLEN.get(kind, 0) * vlen

    @classmethod
    def vmlinux(cls, path: Path = VMLINUX) -> Btf:
        """The running kernel's BTF (``path``: another file, the loaders' test seam)."""
        try:
            return cls(path.read_bytes())
        except OSError as exc:
            raise BtfError(f"cannot read {path}: {exc}") from exc

    def _name(self, off: int) -> str:
        start = self._strs + off
        end = self._data.index(b"\0", start, self._str_end)
        return self._data[start:end].decode()

    def _resolve(self, tid: int) -> int:
        for _ in range(32):  # modifier chains are short; bounded against a looped blob
            kind, _n, _v, _k, ref, _x = self._types[tid]
            if kind not in _MODIFIERS:
                return tid
            tid = ref
        raise BtfError("modifier chain too long")

    def _find_member(self, tid: int, member: str, depth: int = 0) -> int | None:
        """Byte offset of ``member`` in struct/union ``tid`` (anonymous members searched)."""
        kind, _n, vlen, kflag, _size, p = self._types[tid]
        if kind not in (_STRUCT, _UNION) or depth > 8:
            return None
        for i in range(vlen):
            m_name, m_type, m_off = struct.unpack_from("<III", self._data, p + 12 * i)
            bits = int(m_off & 0xFFFFFF if kflag else m_off)
            if m_name and self._name(m_name) == member:
                return bits // 8
            if not m_name:
                inner = self._find_member(self._resolve(m_type), member, depth + 1)
                if inner is not None:
                    return bits // 8 + inner
        return None

    def member_offset(self, struct_name: str, member: str) -> int:
        for tid, (kind, name_off, _v, _k, _s, _x) in enumerate(self._types):
            if kind == _STRUCT and name_off and self._name(name_off) == struct_name:
                off = self._find_member(tid, member)
                if off is not None:
                    return off
        raise BtfError(f"struct {struct_name} has no member {member} in this BTF")
