"""Errors carry the library's detailed message (rkv_last_error_message): which argument,
which value, which limit; the status stays available as ``.status``."""

import threading

import pytest

import radixkv
from radixkv import Cache, Status
from radixkv._native import lib


def test_insert_names_the_slot_its_position_and_the_limit():
    with Cache(pool_slots=65536) as c:
        s = list(c.alloc(3)) + [70000]
        with pytest.raises(radixkv.InvalidArgumentError) as e:
            c.insert([1, 2, 3, 4], s)
        assert e.value.status == Status.INVALID_ARGUMENT
        assert "Cache.insert: slots[3] = 70000 is out of range: the pool has 65536 slots" in str(e.value)
        s[3] = s[0]
        with pytest.raises(radixkv.InvalidArgumentError, match=r"slots\[0\] = \d+ is given twice"):
            c.insert_lock([1, 2, 3, 4], s)
        with pytest.raises(radixkv.InvalidArgumentError, match=r"runs\[1\] = \{start 7, len 0\} is empty"):
            c.insert_runs([1, 2], [(s[0], 2), (7, 0)])
        assert c.stats().cached_tokens == 0


def test_free_alloc_and_options_say_what_was_wrong():
    with Cache(pool_slots=64) as c:
        a = c.alloc(4)
        c.free(a[:1])
        with pytest.raises(radixkv.DoubleFreeError) as e:
            c.free(a[:2])
        assert f"Cache.free: slots[0] = {a[0]} is free, not held by the caller" in str(e.value)
        assert e.value.status == Status.DOUBLE_FREE
        with pytest.raises(radixkv.InvalidArgumentError, match=r"slots\[1\] = 1000 is out of range"):
            c.free([a[1], 1000])
        with pytest.raises(radixkv.OutOfSlotsError, match="Cache.alloc: n = 62, but only 61 slots are free"):
            c.alloc(62)
        with pytest.raises(radixkv.OutOfSlotsError, match="Cache.alloc: n = 100 is more than the whole pool of 64"):
            c.alloc(100)
    with pytest.raises(radixkv.InvalidArgumentError, match="^Cache: pool_slots = 100 is not a multiple of page_size = 16"):
        Cache(page_size=16, pool_slots=100)
    with Cache() as c:
        with pytest.raises(radixkv.NoPoolError, match="Cache.alloc: this cache has no slot pool"):
            c.alloc(1)


def test_locks_say_why_they_are_refused():
    with Cache() as c:
        c.insert([1, 2], [5, 6])
        lock = c.match_lock([1, 2])
        lock.release()
        with pytest.raises(radixkv.InvalidLockError, match=r"Lock.release: lock 0x[0-9a-f]+ was released already"):
            lock.release()


def test_a_success_clears_the_message_and_threads_do_not_share_it():
    with Cache() as c:
        with pytest.raises(radixkv.NoPoolError):
            c.alloc(1)
        assert lib.rkv_last_error_message().startswith(b"Cache.alloc:")
        seen = []
        t = threading.Thread(target=lambda: seen.append(lib.rkv_last_error_message()))
        t.start()
        t.join()
        assert seen == [b""]
        c.stats()
        assert lib.rkv_last_error_message() == b""


def _message(call):
    try:
        call()
    except radixkv.RadixKvError as e:
        return str(e)
    raise AssertionError("the call did not fail")


def test_messages_name_the_python_method_not_a_c_function():
    c = Cache(page_size=4, pool_slots=16)
    cases = [
        (lambda: c.insert([1, 2, 3, 4], [1, 2, 3]), "Cache.insert: "),
        (lambda: c.insert_runs([1, 2, 3, 4], [(0, 3)]), "Cache.insert_runs: "),
        (lambda: c.alloc(3), "Cache.alloc: n = 3 is not a multiple"),
        (lambda: c.alloc_runs(32), "Cache.alloc_runs: n = 32 is more than the whole pool"),
        (lambda: c.free([99]), "Cache.free: "),
        (lambda: c.free_runs([(99, 1)]), "Cache.free_runs: "),
        (lambda: c.flush_events(), "Cache.flush_events: events are not enabled"),
        (lambda: c.set_namespace_meta(1, "x"), "Cache.set_namespace_meta: "),
        (lambda: c.load_back([1]), "Cache.load_back: this cache has no host tier"),
        (lambda: Cache(page_size=0), "Cache: page_size = 0"),
        (lambda: Cache(page_size=4, pool_slots=6), "Cache: pool_slots = 6 is not a multiple of page_size = 4"),
        (lambda: Cache(page_size=4, pool_slots=16, host=dict(host_slots=6)), "Cache: "),
        (lambda: Cache(pool_slots=0).alloc(1), "Cache.alloc: this cache has no slot pool"),
        (lambda: radixkv.RouterIndex(block_size=0), "block_size (0)"),
    ]
    lk = c.match_lock([1])
    lk.release()
    cases.append((lk.release, "Lock.release: "))
    for call, want in cases:
        m = _message(call)
        assert m.startswith(want), (want, m)
        assert "rkv_" not in m and "NULL" not in m and "opts->" not in m, m
