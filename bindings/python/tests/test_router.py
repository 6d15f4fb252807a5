"""radixkv.RouterIndex: the router index (ROUTER.md) from Python: typed events, vLLM msgpack
batches (built here by a small msgpack encoder: msgpack itself is not a dependency), find
scores, namespaces, cursors and gaps, refusals with their fields, dump/restore, and several
threads at once."""

import struct
import threading
from array import array

import pytest

import radixkv
from radixkv import (
    BatchReport,
    CacheClosedError,
    InvalidArgumentError,
    RouterIndex,
    Score,
    SequenceGapError,
    Status,
    Worker,
)

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is in the test extra
    np = None

needs_numpy = pytest.mark.skipif(np is None, reason="numpy not installed")

BS = 4


def toks(n_blocks, start=0):
    """`n_blocks` blocks of distinct tokens beginning at `start`."""
    return list(range(start, start + n_blocks * BS))


# ---- a minimal msgpack encoder (the subset vLLM's KV-event batches use) ----------------


def mp(v):
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack("b", v)
        if v >= 0:
            return b"\xcf" + struct.pack(">Q", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode()
        if len(b) < 32:
            return bytes([0xA0 | len(b)]) + b
        return b"\xd9" + bytes([len(b)]) + b
    if isinstance(v, (list, tuple)):
        n = len(v)
        head = bytes([0x90 | n]) if n < 16 else b"\xdd" + struct.pack(">I", n)
        return head + b"".join(mp(x) for x in v)
    raise TypeError(type(v))


def ev_stored(hashes, tokens, parent=None, medium="GPU", lora_name=None, cache_salt=None, block_size=BS,
              group=(0, "full_attention", None)):
    extra = None
    if cache_salt is not None:
        extra = [["dynamo-cache-salt:" + cache_salt]] + [None] * (len(hashes) - 1)
    return ["BlockStored", list(hashes), parent, list(tokens), block_size, None, medium, lora_name, extra,
            *group]


def ev_removed(hashes, medium="GPU", group_idx=0):
    return ["BlockRemoved", list(hashes), medium, group_idx]


def ev_cleared():
    return ["AllBlocksCleared"]


def batch(*events, dp_rank=0, ts=1.5):
    """A vLLM KV-event batch payload: [ts, events, data_parallel_rank] (msgspec array_like)."""
    return mp([ts, list(events), dp_rank])


def scores(r, tokens, **kw):
    return {(s.worker_id, s.dp_rank): (s.device_blocks, s.any_blocks) for s in r.find(tokens, **kw)}


# ---- typed events and find ------------------------------------------------------------


def test_two_workers_chains_device_and_any():
    r = RouterIndex(block_size=BS)
    assert (r.block_size, r.max_workers, r.gap_policy) == (BS, 4096, "clear")
    t = toks(4)
    r.stored(1, [101, 102, 103], t[: 3 * BS])
    r.stored(2, [201, 202], t[: 2 * BS])
    r.stored(2, [203], t[2 * BS : 3 * BS], parent=202, medium="cpu")
    got = r.find(t + [7, 7])  # a partial last block is ignored
    assert got == [Score(1, 0, 3, 3), Score(2, 0, 2, 3)]
    assert got[1].worker == Worker(2, 0) and isinstance(got[0], tuple)
    # A request that leaves the chain after two blocks.
    assert scores(r, t[: 2 * BS] + toks(1, start=900)) == {(1, 0): (2, 2), (2, 0): (2, 2)}
    # Nobody holds the first block: no scores.
    assert r.find(toks(2, start=500)) == []
    assert r.find([]) == []
    s = r.stats()
    assert (s["workers"], s["blocks"], s["memberships"], s["events"]) == (2, 3, 6, 3)
    assert s["refused"] == 0 and set(s["refused_by"]) == {
        "malformed", "unknown_parent", "unknown_removal", "unaligned", "empty", "too_many_workers", "sequence_gap"}


def test_host_only_worker_scores_zero_device_blocks():
    r = RouterIndex(block_size=BS)
    r.stored(5, [1, 2], toks(2), medium="CPU_PINNED")
    assert r.find(toks(2)) == [Score(5, 0, 0, 2)]
    r.stored(5, [1], toks(1), medium="gpu")  # the same block gets a device copy too
    assert r.find(toks(2)) == [Score(5, 0, 1, 2)]


def test_holes_stop_the_count():
    r = RouterIndex(block_size=BS)
    t = toks(4)
    r.stored(1, [1, 2, 3, 4], t)
    r.stored(2, [1, 2, 3, 4], t)
    r.removed(1, [2])  # a hole at block 1: blocks 2 and 3 no longer count
    assert scores(r, t) == {(1, 0): (1, 1), (2, 0): (4, 4)}
    # A device hole only: block 1 held on the host still counts for `any`.
    r.stored(2, [2], t[BS : 2 * BS], parent=1, medium="cpu")
    r.removed(2, [2], medium="gpu")
    assert scores(r, t) == {(1, 0): (1, 1), (2, 0): (1, 4)}


def test_namespaces_by_lora_name_and_cache_salt():
    r = RouterIndex(block_size=BS)
    t = toks(2)
    r.stored(1, [1, 2], t, lora_name="a")
    r.stored(2, [1, 2], t, cache_salt="s")
    r.stored(3, [1, 2], t)
    assert scores(r, t) == {(3, 0): (2, 2)}
    assert scores(r, t, lora_name="a") == {(1, 0): (2, 2)}
    assert scores(r, t, cache_salt="s") == {(2, 0): (2, 2)}
    assert scores(r, t, lora_name="a", cache_salt="s") == {}
    # content_hashes mixes the namespace in: find_hashes agrees with find.
    for ns in ({}, {"lora_name": "a"}, {"cache_salt": "s"}):
        h = radixkv.content_hashes(t, BS, **ns)
        assert isinstance(h, array) and h.typecode == "Q" and len(h) == 2
        assert r.find_hashes(h) == r.find(t, **ns)
    assert radixkv.content_hashes(t, BS, lora_name="a") != radixkv.content_hashes(t, BS)
    assert len(radixkv.content_hashes(t + [1], BS)) == 2


def test_stored_hashes_is_stored_with_content_hashes():
    a, b = RouterIndex(block_size=BS), RouterIndex(block_size=BS)
    t = toks(3)
    a.stored(1, [7, 8, 9], t, lora_name="l")
    b.stored_hashes(1, [7, 8, 9], radixkv.content_hashes(t, BS, lora_name="l"))
    assert a.dump() == b.dump()
    assert b.find(t, lora_name="l") == [Score(1, 0, 3, 3)]


def test_removed_unknown_hashes_raise_with_the_count():
    r = RouterIndex(block_size=BS)
    r.stored(1, [1, 2, 3], toks(3))
    with pytest.raises(radixkv.UnknownRemovalsError) as e:
        r.removed(1, [3, 77, 78])
    assert e.value.count == 2 and e.value.status == Status.INVALID_ARGUMENT
    assert isinstance(e.value, ValueError) and isinstance(e.value, InvalidArgumentError)
    assert "RouterIndex.removed" in str(e.value)
    assert scores(r, toks(3)) == {(1, 0): (2, 2)}  # the held one went all the same
    with pytest.raises(radixkv.UnknownRemovalsError):
        r.removed(1, [2], medium="cpu")  # held on the device only
    with pytest.raises(radixkv.UnknownRemovalsError) as e:
        r.removed(9, [1])  # an unknown worker
    assert e.value.count == 1
    r.removed(9, [])
    assert r.stats()["refused_by"]["unknown_removal"] == 4


def test_cleared_keeps_the_cursor_and_remove_worker_forgets():
    r = RouterIndex(block_size=BS)
    r.apply_batch(1, 10, batch(ev_stored([1, 2], toks(2))))
    r.stored(2, [1], toks(1), dp_rank=1)
    assert r.next_seq(1) == 11
    r.cleared(1)
    assert scores(r, toks(2)) == {(2, 1): (1, 1)}
    assert r.next_seq(1) == 11 and r.stats()["workers"] == 2
    assert r.next_seq(2, dp_rank=1) is None and r.next_seq(3) is None
    assert r.remove_worker(2, dp_rank=1) is True
    assert r.remove_worker(2, dp_rank=1) is False
    assert r.remove_worker(1) is True
    assert r.next_seq(1) is None
    assert r.find(toks(2)) == [] and r.dump() == []
    s = r.stats()
    assert (s["workers"], s["blocks"], s["memberships"]) == (0, 0, 0)
    r.reclaim()
    assert r.stats()["bytes"] == r.empty_bytes()


# ---- batches --------------------------------------------------------------------------


def test_apply_batch_skips_a_hybrid_models_other_kv_groups():
    """vLLM's stream of a sliding-window model: group 1's store and removals (of hashes the
    full-attention group holds, too) are skipped and counted, and change nothing."""
    r = RouterIndex(block_size=BS)
    t = toks(2)
    assert r.apply_batch(7, 0, batch(ev_stored([11, 12], t))) == BatchReport(1, 0, False)
    sliding = (1, "sliding_window", 4 * BS)
    p = batch(ev_stored([91, 92], t, group=sliding), ev_removed([91, 11, 12], group_idx=1),
              ev_stored([93], t[:BS], group=(2, "mamba", None)))
    assert r.apply_batch(7, 1, p) == BatchReport(3, 0, False)
    assert scores(r, t) == {(7, 0): (2, 2)}
    s = r.stats()
    assert (s["other_groups"], s["refused"], s["blocks"]) == (3, 0, 2)
    # The full group's own removal applies.
    r.apply_batch(7, 2, batch(ev_removed([12])))
    assert scores(r, t) == {(7, 0): (1, 1)}


def test_apply_batch_vllm_msgpack():
    r = RouterIndex(block_size=BS)
    t = toks(3)
    p = batch(
        ev_stored([11, 12], t[: 2 * BS]),
        ev_stored([13], t[2 * BS :], parent=12, medium="CPU_PINNED"),
        ev_stored([21], t[:BS], lora_name="lora"),
        ev_stored([31], t[:BS], cache_salt="salt"),
        dp_rank=3,
    )
    rep = r.apply_batch(7, 100, p)
    assert rep == BatchReport(events=4, refused=0, cleared_first=False)
    assert scores(r, t) == {(7, 3): (2, 3)}
    assert scores(r, t, lora_name="lora") == {(7, 3): (1, 1)}
    assert scores(r, t, cache_salt="salt") == {(7, 3): (1, 1)}
    assert r.next_seq(7, dp_rank=3) == 101 and r.next_seq(7) is None
    # A typed store of the same tokens lands on the same blocks (the chain keys are the
    # router's own, whatever the engine hashes).
    r.stored(8, [900, 901, 902], t)
    assert scores(r, t) == {(7, 3): (2, 3), (8, 0): (3, 3)}
    rep = r.apply_batch(7, 101, batch(ev_removed([12]), ev_removed([13], medium="CPU_PINNED"), dp_rank=3))
    assert rep == BatchReport(2, 0, False)
    assert scores(r, t) == {(7, 3): (1, 1), (8, 0): (3, 3)}
    r.apply_batch(7, 102, batch(ev_cleared(), dp_rank=3))
    assert scores(r, t) == {(8, 0): (3, 3)}
    s = r.stats()
    assert (s["batches"], s["events"], s["gaps"], s["restarts"]) == (3, 8, 0, 0)
    # Bytes-like payloads other than bytes.
    for obj in (bytearray(p), memoryview(p)) + ((np.frombuffer(p, dtype=np.uint8),) if np else ()):
        r2 = RouterIndex(block_size=BS)
        assert r2.apply_batch(7, 0, obj).events == 4
        assert scores(r2, t) == {(7, 3): (2, 3)}


def test_apply_batch_skips_events_refused_for_their_content():
    r = RouterIndex(block_size=BS)
    p = batch(
        ev_stored([1], toks(1)),
        ev_stored([2], toks(1, start=50), parent=999),  # unknown parent
        ev_stored([3], toks(1)[:3]),  # unaligned
        ev_stored([4], toks(1), block_size=8),  # another block size
        ev_stored([], []),  # empty
        ev_removed([42]),  # unknown removal
    )
    assert r.apply_batch(1, 0, p) == BatchReport(6, 5, False)
    assert scores(r, toks(1)) == {(1, 0): (1, 1)}
    by = r.stats()["refused_by"]
    assert (by["unknown_parent"], by["unaligned"], by["empty"], by["unknown_removal"]) == (1, 2, 1, 1)


def test_seq_restart_clears_the_worker():
    r = RouterIndex(block_size=BS)
    r.apply_batch(1, 5, batch(ev_stored([1, 2], toks(2))))
    r.apply_batch(1, 6, batch(ev_stored([3], toks(1, start=2 * BS), parent=2)))
    assert scores(r, toks(3)) == {(1, 0): (3, 3)}
    rep = r.apply_batch(1, 0, batch(ev_stored([9], toks(1, start=100))))
    assert rep.cleared_first is True
    assert r.find(toks(3)) == [] and scores(r, toks(1, start=100)) == {(1, 0): (1, 1)}
    assert r.next_seq(1) == 1 and r.stats()["restarts"] == 1


def test_gap_under_clear_clears_then_applies():
    r = RouterIndex(block_size=BS, gap_policy="clear")
    r.apply_batch(1, 10, batch(ev_stored([1], toks(1))))
    rep = r.apply_batch(1, 12, batch(ev_stored([2], toks(1, start=40))))
    assert rep == BatchReport(1, 0, True)
    assert r.find(toks(1)) == [] and scores(r, toks(1, start=40)) == {(1, 0): (1, 1)}
    assert r.next_seq(1) == 13 and r.stats()["gaps"] == 1


def test_gap_under_refuse_raises_with_fields_and_replay_succeeds():
    r = RouterIndex(block_size=BS, gap_policy="REFUSE")
    assert r.gap_policy == "refuse"
    r.apply_batch(7, 10, batch(ev_stored([1], toks(1))))
    before = r.dump()
    with pytest.raises(SequenceGapError) as e:
        r.apply_batch(7, 13, batch(ev_stored([3], toks(1, start=2 * BS), parent=2)))
    err = e.value
    assert (err.expected, err.got, err.worker) == (11, 13, Worker(7, 0))
    assert err.worker.worker_id == 7 and err.worker.dp_rank == 0
    assert err.status == radixkv._router.SEQUENCE_GAP == 11
    assert isinstance(err, radixkv.RouterError) and isinstance(err, radixkv.RadixKvError)
    assert not isinstance(err, ValueError)
    assert err.fields == {"worker": Worker(7, 0), "expected": 11, "got": 13}
    assert r.dump() == before  # nothing applied, the cursor kept
    assert r.next_seq(7) == 11
    assert r.stats()["refused_by"]["sequence_gap"] == 1 and r.stats()["gaps"] == 1
    # Replay from next_seq, then the batch applies.
    r.apply_batch(7, 11, batch(ev_stored([2], toks(1, start=BS), parent=1)))
    r.apply_batch(7, 12, batch())
    assert r.apply_batch(7, 13, batch(ev_stored([3], toks(1, start=2 * BS), parent=2))).cleared_first is False
    assert scores(r, toks(3)) == {(7, 0): (3, 3)} and r.next_seq(7) == 14


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x00garbage",
        b"\xc1",
        mp(5),  # not an array
        mp([1.0, 5, 0]),  # events not an array
        mp([1.0, [["NoSuchEvent"]], 0]),
        mp([1.0, [ev_stored([1], toks(1))[:3]], 0]),  # missing fields
        mp([1.0, [ev_stored([1], toks(1), medium="DISK")], 0]),
        mp([1.0, [ev_stored([1], toks(1)), ["BlockRemoved", [1.5], "GPU", 0]], 0]),
        mp([1.0, [], -1]),  # a negative data_parallel_rank
        batch(ev_stored([1], toks(1)))[:-3],  # truncated
    ],
)
def test_malformed_payload_refused_whole_index_unchanged(payload):
    r = RouterIndex(block_size=BS)
    r.apply_batch(1, 0, batch(ev_stored([1, 2], toks(2))))
    before, stats = r.dump(), r.stats()
    with pytest.raises(radixkv.MalformedBatchError) as e:
        r.apply_batch(1, 1, payload)
    assert isinstance(e.value, ValueError) and e.value.status == Status.INVALID_ARGUMENT
    assert isinstance(e.value.reason, str) and e.value.reason
    assert str(e.value).startswith("RouterIndex.apply_batch: malformed KV-event batch")
    assert r.dump() == before and r.next_seq(1) == 1
    after = r.stats()
    assert after["refused_by"]["malformed"] == stats["refused_by"]["malformed"] + 1
    assert (after["blocks"], after["memberships"], after["events"]) == (2, 2, stats["events"])


def test_payload_must_be_bytes_like():
    r = RouterIndex(block_size=BS)
    for bad in ("text", 5, None, [1, 2]):
        with pytest.raises(TypeError):
            r.apply_batch(1, 0, bad)


# ---- inputs ---------------------------------------------------------------------------


def test_token_and_hash_buffers():
    r = RouterIndex(block_size=BS)
    t = toks(3)
    r.stored(1, array("Q", [1, 2, 3]), array("I", t))
    r.stored(2, (2**64 - 1, -2, 5), tuple(t))  # negative hashes are their bits
    r.stored(3, iter([1, 2, 3]), iter(t))
    want = {(1, 0): (3, 3), (2, 0): (3, 3), (3, 0): (3, 3)}
    for form in (t, tuple(t), array("I", t), array("q", t), array("i", t), range(len(t))):
        assert scores(r, form) == want
    assert r.dump()[1]["blocks"][0][0] == 5 and {b[0] for b in r.dump()[1]["blocks"]} == {5, 2**64 - 2, 2**64 - 1}
    r.removed(2, array("q", [-1, -2]))
    assert (2, 0) not in scores(r, t)  # its first block is gone
    r.removed(2, [5])
    assert (2, 0) not in scores(r, t)
    h = radixkv.content_hashes(array("I", t), BS)
    assert r.find_hashes(list(h)) == r.find_hashes(h) == r.find(t)


@needs_numpy
def test_numpy_arrays():
    r = RouterIndex(block_size=BS)
    t = np.arange(3 * BS, dtype=np.uint32)
    r.stored(1, np.array([1, 2, 3], dtype=np.uint64), t)
    r.stored(2, np.array([-1, -2, -3], dtype=np.int64), t.astype(np.int64))
    r.stored(3, np.array([1, 2, 3], dtype=np.uint32), t[::1].astype(np.int32))
    want = {(1, 0): (3, 3), (2, 0): (3, 3), (3, 0): (3, 3)}
    for form in (t, t.astype(np.int64), t.astype(np.uint16), np.concatenate([t, t])[: 3 * BS], t[::-1][::-1]):
        assert scores(r, form) == want
    assert {b[0] for b in r.dump()[1]["blocks"]} == {2**64 - 1, 2**64 - 2, 2**64 - 3}
    r.removed(2, np.array([2**64 - 3], dtype=np.uint64))
    assert scores(r, t)[(2, 0)] == (2, 2)
    h = np.frombuffer(radixkv.content_hashes(t, BS), dtype=np.uint64)
    assert r.find_hashes(h) == r.find_hashes(h.view(np.int64)) == r.find(t)
    with pytest.raises(TypeError):
        r.find(t.astype(np.float64))
    with pytest.raises(TypeError):
        r.find(t.reshape(3, BS))
    with pytest.raises(ValueError, match=r"tokens\[1\] = -5"):
        r.find(np.array([0, -5, 0, 0], dtype=np.int64))
    with pytest.raises(ValueError, match=r"block_hashes\[0\] = -1"):
        r.stored(4, np.array([-1], dtype=np.int32), t[:BS])


def test_bad_inputs():
    r = RouterIndex(block_size=BS, max_workers=2)
    # Tokens that do not cut into the blocks.
    with pytest.raises(radixkv.UnalignedError) as e:
        r.stored(1, [1, 2], toks(2)[:-1])
    assert (e.value.blocks, e.value.tokens, e.value.block_size, e.value.expected) == (2, 7, BS, BS)
    assert isinstance(e.value, ValueError) and e.value.status == Status.INVALID_ARGUMENT
    with pytest.raises(radixkv.EmptyStoreError):
        r.stored(1, [], [])
    with pytest.raises(radixkv.UnknownParentError) as e:
        r.stored(1, [2], toks(1), parent=-1)
    assert e.value.parent == 2**64 - 1
    # Ids and values out of range, wrong types.
    with pytest.raises(ValueError):
        r.stored(-1, [1], toks(1))
    with pytest.raises(ValueError):
        r.stored(1, [1], toks(1), dp_rank=-1)
    with pytest.raises(ValueError):
        r.stored(1, [1], toks(1), dp_rank=2**32)
    with pytest.raises(ValueError):
        r.next_seq(2**64)
    with pytest.raises(ValueError):
        r.apply_batch(-3, 0, batch())
    with pytest.raises(ValueError, match=r"token_ids\[2\] = -1"):
        r.stored(1, [1], [0, 0, -1, 0])
    with pytest.raises(ValueError, match=r"tokens\[0\] = 4294967296"):
        r.find([2**32, 0, 0, 0])
    with pytest.raises(ValueError, match=r"block_hashes\[1\]"):
        r.stored(1, [1, 2**64], toks(2))
    with pytest.raises(TypeError):
        r.stored(1, [1.5], toks(1))
    with pytest.raises(TypeError):
        r.find([0.5, 1, 2, 3])
    with pytest.raises(TypeError):
        r.find("abcd")
    with pytest.raises(TypeError):
        r.find_hashes(b"12345678")
    with pytest.raises(TypeError):
        r.stored(True, [1], toks(1))
    with pytest.raises(TypeError):
        r.stored(1, [1], toks(1), lora_name=5)
    with pytest.raises(InvalidArgumentError):
        r.stored(1, [1], toks(1), medium="disk")
    # Nothing was stored, and no worker registered (the refused UnknownParent store
    # included).
    s = r.stats()
    assert (s["memberships"], s["workers"], r.dump()) == (0, 0, [])
    # Too many workers.
    r.stored(1, [1], toks(1))
    r.stored(2, [1], toks(1))
    with pytest.raises(radixkv.TooManyWorkersError) as e:
        r.stored(3, [1], toks(1))
    assert e.value.max_workers == 2 and isinstance(e.value, ValueError)
    with pytest.raises(radixkv.TooManyWorkersError):
        r.apply_batch(3, 0, batch())
    assert r.stats()["refused_by"]["too_many_workers"] == 2 and r.stats()["workers"] == 2
    r.remove_worker(1)
    r.stored(3, [1], toks(1))  # a slot is free again


def test_bad_options():
    for kw in ({"gap_policy": "sometimes"}, {"gap_policy": 1}, {"block_size": 0}, {"max_workers": 0},
               {"max_workers": 2**29 + 1}):
        with pytest.raises(InvalidArgumentError) as e:
            RouterIndex(**kw)
        assert e.value.status == Status.INVALID_ARGUMENT
    with pytest.raises(radixkv.RouterOptionsError) as e:
        RouterIndex(max_workers=2**29 + 1)
    assert e.value.max_workers == 2**29 + 1 and e.value.block_size == 16
    with pytest.raises(ValueError):
        RouterIndex(block_size=-1)
    with pytest.raises(ValueError):
        RouterIndex(block_size=2**32)
    with pytest.raises(TypeError):
        RouterIndex(block_size=4.0)
    with pytest.raises(ValueError):
        radixkv.content_hashes([1, 2], 0)


# ---- dump, restore, lifetime ----------------------------------------------------------


def _populated():
    r = RouterIndex(block_size=BS, max_workers=64, gap_policy="refuse")
    t = toks(4)
    r.apply_batch(1, 3, batch(ev_stored([11, 12, 13], t[: 3 * BS]), ev_stored([14], t[3 * BS :], parent=13,
                                                                               medium="CPU_PINNED"), dp_rank=2))
    r.stored(2, [21, 22], t[: 2 * BS])
    r.stored(2, [22], t[BS : 2 * BS], parent=21, medium="cpu")
    r.stored(3, [2**63 + 5], toks(1, start=77), lora_name="x", cache_salt="y", dp_rank=9)
    r.stored(4, [1], t[:BS])
    r.cleared(4)  # known, holds nothing
    return r


def test_dump_restore_equality():
    r = _populated()
    d = r.dump()
    assert [(w["worker_id"], w["dp_rank"], w["next_seq"]) for w in d] == [(1, 2, 4), (2, 0, None), (3, 9, None),
                                                                         (4, 0, None)]
    assert [b[0] for b in d[0]["blocks"]] == [11, 12, 13, 14] and d[0]["blocks"][3][2] == 2
    assert d[1]["blocks"][1][2] == 3 and d[3]["blocks"] == []
    r2 = RouterIndex.restore(d, block_size=BS, max_workers=64, gap_policy="refuse")
    assert r2.dump() == d
    assert (r2.block_size, r2.max_workers, r2.gap_policy) == (BS, 64, "refuse")
    for q in (toks(4), toks(2)):
        assert r2.find(q) == r.find(q)
    assert r2.find(toks(1, start=77), lora_name="x", cache_salt="y") == [Score(3, 9, 1, 1)]
    s1, s2 = r.stats(), r2.stats()
    for k in ("workers", "blocks", "memberships"):
        assert s1[k] == s2[k]
    # The restored cursor refuses the same gap and takes the next batch.
    with pytest.raises(SequenceGapError) as e:
        r2.apply_batch(1, 9, batch(dp_rank=2))
    assert (e.value.expected, e.value.worker) == (4, Worker(1, 2))
    r2.apply_batch(1, 4, batch(ev_removed([14], medium="CPU_PINNED"), dp_rank=2))
    r.apply_batch(1, 4, batch(ev_removed([14], medium="CPU_PINNED"), dp_rank=2))
    assert r2.dump() == r.dump()
    assert RouterIndex.restore([]).dump() == []


def test_dump_keeps_the_kv_group_kinds_stores_taught():
    """A dump saves each worker's learned KV cache group kinds: after a restore, a removal of
    group 3 (its store: MLA, main attention) still applies. A record without ``groups`` (a
    dump from before them) restores with none learned: that removal is then skipped."""
    r = RouterIndex(block_size=BS)
    t = toks(2)
    r.apply_batch(1, 0, batch(ev_stored([11, 12], t), ev_stored([31, 32], toks(2, start=50),
                                                               group=(3, "mla_attention", None))))
    d = r.dump()
    assert d[0]["groups"] == [(3, True)]
    back = RouterIndex.restore(d, block_size=BS)
    assert back.dump() == d
    old = RouterIndex.restore([{k: v for k, v in d[0].items() if k != "groups"}], block_size=BS)
    assert old.dump()[0]["groups"] == []
    for x in (r, back, old):
        x.apply_batch(1, 1, batch(ev_removed([32], group_idx=3)))
    q = toks(2, start=50)
    assert scores(back, q) == scores(r, q) == {(1, 0): (1, 1)}
    assert scores(old, q) == {(1, 0): (2, 2)}
    assert (old.stats()["other_groups"], back.stats()["other_groups"]) == (1, 0)
    with pytest.raises(radixkv.BadDumpError):
        RouterIndex.restore([dict(d[0], groups=[(3, True), (3, False)])], block_size=BS)
    with pytest.raises(ValueError):
        RouterIndex.restore([dict(d[0], groups=[(3,)])], block_size=BS)


def test_restore_refuses_bad_dumps():
    d = _populated().dump()
    bad = [dict(d[0], blocks=[(1, 2, 0)])]
    with pytest.raises(radixkv.BadDumpError) as e:
        RouterIndex.restore(bad, block_size=BS)
    assert e.value.worker == Worker(1, 2)
    with pytest.raises(radixkv.BadDumpError):
        RouterIndex.restore([dict(d[0], blocks=[(1, 2, 4)])], block_size=BS)
    with pytest.raises(TypeError):
        RouterIndex.restore([5], block_size=BS)
    with pytest.raises(ValueError):
        RouterIndex.restore([{"worker_id": 1}], block_size=BS)
    with pytest.raises(ValueError):
        RouterIndex.restore([dict(d[0], worker_id=-1)], block_size=BS)
    with pytest.raises(ValueError):
        RouterIndex.restore([dict(d[0], blocks=[(1, 2)])], block_size=BS)
    with pytest.raises(radixkv.TooManyWorkersError):
        RouterIndex.restore(d, block_size=BS, max_workers=2)


def test_close_and_context_manager():
    with RouterIndex(block_size=BS) as r:
        r.stored(1, [1], toks(1))
        assert "1 workers" in repr(r)
    assert r.closed and "closed" in repr(r)
    with pytest.raises(CacheClosedError, match="router index is closed"):
        r.find(toks(1))
    with pytest.raises(CacheClosedError):
        r.stored(1, [2], toks(1))
    with pytest.raises(CacheClosedError):
        r.dump()
    r.close()  # idempotent
    import copy
    import pickle

    r = RouterIndex()
    with pytest.raises(TypeError):
        copy.copy(r)
    with pytest.raises(TypeError):
        pickle.dumps(r)


# ---- threads --------------------------------------------------------------------------


def test_threads_find_while_another_applies():
    """Readers see every worker's score as one after a prefix of its events: the static
    worker always whole, the growing/shrinking one a chain prefix (device == any, both
    within the chain), never more than it stored; at the end both indexes agree."""
    n = 24
    t = toks(n)
    hashes = list(range(1000, 1000 + n))
    r = RouterIndex(block_size=BS)
    r.stored(1, hashes, t)
    stop = threading.Event()
    errors = []
    seen = []

    def reader(arr):
        try:
            k = 0
            while not stop.is_set() or k < 50:
                k += 1
                got = scores(r, arr)
                if got.get((1, 0)) != (n, n):
                    errors.append(("static", got))
                w2 = got.get((2, 0))
                if w2 is not None:
                    dev, anyb = w2
                    if not (dev == anyb and 1 <= anyb <= n):
                        errors.append(("moving", got))
                    seen.append(anyb)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    forms = [t, array("I", t)] + ([np.asarray(t, dtype=np.uint32), np.asarray(t, dtype=np.int64)] if np else [])
    readers = [threading.Thread(target=reader, args=(forms[i % len(forms)],)) for i in range(4)]
    for th in readers:
        th.start()
    seq = 0
    try:
        for rnd in range(30):
            # Grow worker 2 block by block (batches), then drop its tail block by block.
            for i in range(n):
                ev = ev_stored([hashes[i]], t[i * BS : (i + 1) * BS], parent=hashes[i - 1] if i else None)
                r.apply_batch(2, seq, batch(ev))
                seq += 1
            for i in reversed(range(n // 2, n)):
                r.removed(2, [hashes[i]])
            if rnd % 3 == 1:
                r.apply_batch(2, seq, batch(ev_cleared()))
                seq += 1
    finally:
        stop.set()
        for th in readers:
            th.join()
    assert errors == []
    assert seen  # the readers met worker 2
    final = scores(r, t)
    assert final == {(1, 0): (n, n), (2, 0): (n // 2, n // 2)}
    # The same events typed into a fresh index give the same holdings.
    ref = RouterIndex(block_size=BS)
    ref.stored(1, hashes, t)
    ref.stored(2, hashes[: n // 2], t[: n // 2 * BS])
    d, e = r.dump(), ref.dump()
    assert [w["blocks"] for w in d] == [w["blocks"] for w in e]
    assert d[1]["next_seq"] == seq


def test_threads_writers_of_different_workers():
    r = RouterIndex(block_size=BS)
    t = toks(8)
    errors = []

    def writer(w):
        try:
            for k in range(200):
                r.stored(w, list(range(8)), t)
                if k % 2:
                    r.removed(w, [4, 5, 6, 7])
                else:
                    r.cleared(w)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ths = [threading.Thread(target=writer, args=(w,)) for w in range(1, 7)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert errors == []
    assert scores(r, t) == {(w, 0): (4, 4) for w in range(1, 7)}
    s = r.stats()
    assert (s["workers"], s["blocks"], s["memberships"]) == (6, 4, 24)
