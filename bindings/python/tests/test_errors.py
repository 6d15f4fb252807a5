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
        assert "rkv_insert: slots[3] = 70000 is out of range: the pool has 65536 slots" in str(e.value)
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
        assert f"rkv_free: slots[0] = {a[0]} is free, not held by the caller" in str(e.value)
        assert e.value.status == Status.DOUBLE_FREE
        with pytest.raises(radixkv.InvalidArgumentError, match=r"slots\[1\] = 1000 is out of range"):
            c.free([a[1], 1000])
        with pytest.raises(radixkv.OutOfSlotsError, match="n_slots = 62, but only 61 slots are free"):
            c.alloc(62)
        with pytest.raises(radixkv.OutOfSlotsError, match="n_slots = 100 is more than the whole pool of 64"):
            c.alloc(100)
    with pytest.raises(radixkv.InvalidArgumentError, match="opts->pool_slots = 100 is not a multiple of opts->page_size = 16"):
        Cache(page_size=16, pool_slots=100)
    with Cache() as c:
        with pytest.raises(radixkv.NoPoolError, match="rkv_alloc: this cache has no slot pool"):
            c.alloc(1)


def test_locks_say_why_they_are_refused():
    with Cache() as c:
        c.insert([1, 2], [5, 6])
        lock = c.match_lock([1, 2])
        lock.release()
        with pytest.raises(radixkv.InvalidLockError, match=r"rkv_release: lock 0x[0-9a-f]+ was released already"):
            lock.release()


def test_a_success_clears_the_message_and_threads_do_not_share_it():
    with Cache() as c:
        with pytest.raises(radixkv.NoPoolError):
            c.alloc(1)
        assert lib.rkv_last_error_message().startswith(b"rkv_alloc:")
        seen = []
        t = threading.Thread(target=lambda: seen.append(lib.rkv_last_error_message()))
        t.start()
        t.join()
        assert seen == [b""]
        c.stats()
        assert lib.rkv_last_error_message() == b""
