"""BpfMap.drain on a real kernel hash map: the batch path (BPF_MAP_LOOKUP_AND_DELETE_BATCH)
and the per-key walk it replaced return the same entries and leave the map empty.

A map is created here with ``BPF_MAP_CREATE`` (root), filled with ``BPF_MAP_UPDATE_ELEM``,
then drained; sizes cover one batch, several batches and buckets grown past the first
batch size (a small map with many entries per bucket).
"""

from __future__ import annotations

import ctypes
import os
import time

import pytest

from edge_agent import bpfsys
from edge_agent.bpfsys import BpfMap

pytestmark = [pytest.mark.root, pytest.mark.ebpf]

BPF_MAP_CREATE = 0
BPF_MAP_TYPE_HASH = 1


class _CreateAttr(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32)]


class Key(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint8 * 16), ("family", ctypes.c_uint16)]


class Value(ctypes.Structure):
    _fields_ = [("a", ctypes.c_uint64), ("b", ctypes.c_uint32)]


def _hash_map(max_entries: int) -> BpfMap:
    if os.geteuid() != 0:
        pytest.fail("needs root (BPF_MAP_CREATE)")
    fd = bpfsys._sys_bpf(BPF_MAP_CREATE, _CreateAttr(
        map_type=BPF_MAP_TYPE_HASH, key_size=ctypes.sizeof(Key),
        value_size=ctypes.sizeof(Value), max_entries=max_entries))
    return BpfMap(fd, Key, Value, "test")


def _fill(m: BpfMap, n: int) -> dict[tuple[bytes, int], tuple[int, int]]:
    want = {}
    for i in range(n):
        k = Key(family=2 + i % 2)
        k.addr[:4] = list(i.to_bytes(4, "big"))
        m.update(k, Value(a=i * 1000 + 7, b=i))
        want[(bytes(k.addr), k.family)] = (i * 1000 + 7, i)
    return want


def _got(entries: list[tuple[Key, Value]]) -> dict[tuple[bytes, int], tuple[int, int]]:
    return {(bytes(k.addr), k.family): (v.a, v.b) for k, v in entries}


@pytest.mark.parametrize(("max_entries", "n"), [(64, 0), (64, 1), (64, 50), (4096, 1000),
                                                (8, 8)])
def test_batch_and_walk_drain_the_same_entries(max_entries: int, n: int) -> None:
    for batch in (True, False):
        m = _hash_map(max_entries)
        try:
            m._batch = batch
            want = _fill(m, n)
            entries = m.drain()
            assert len(entries) == n, (batch, len(entries), n)
            assert _got(entries) == want, batch
            assert m.drain() == [], f"map not empty after a drain (batch={batch})"
            assert m._batch is batch, "the batch path fell back on a kernel that has it"
        finally:
            os.close(m.fd)


def test_a_bucket_larger_than_the_batch_grows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A batch of 1 cannot hold a bucket of 2 (ENOSPC): the drain grows it and goes on.
    monkeypatch.setattr(bpfsys, "_BATCH", 1)
    m = _hash_map(4)
    try:
        want = _fill(m, 4)
        assert _got(m.drain()) == want
        assert m.drain() == []
    finally:
        os.close(m.fd)


def test_batch_drain_makes_one_system_call_where_the_walk_made_two_per_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The point of the batch: a report's drain of ~20 entries in one call.
    calls: list[int] = []
    real = bpfsys._sys_bpf

    def counting(cmd: int, attr: ctypes.Structure) -> int:
        calls.append(cmd)
        return real(cmd, attr)

    monkeypatch.setattr(bpfsys, "_sys_bpf", counting)
    made, cpu = {}, {}
    for batch in (True, False):
        m = _hash_map(4096)
        try:
            m._batch = batch
            _fill(m, 20)
            calls.clear()
            t0 = time.process_time()
            assert len(m.drain()) == 20
            cpu[batch] = time.process_time() - t0
            made[batch] = len(calls)
        finally:
            os.close(m.fd)
    print(f"\ndrain of 20 entries: batch {made[True]} calls {cpu[True] * 1e6:.0f} us, "
          f"walk {made[False]} calls {cpu[False] * 1e6:.0f} us")
    assert made[True] == 1, made
    assert made[False] == 41, made  # 21 get-next-key (the last one ENOENT) + 20 pops
