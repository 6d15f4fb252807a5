"""The Cache API over the C ABI: matching, locks, inserting, eviction, the pool, stats,
namespaces, array inputs, errors."""

from array import array

import pytest

import radixkv
from radixkv import Cache, Status
from radixkv._cache import INTERNED_BASE, as_u32

try:
    import numpy as np
except ImportError:  # numpy is optional
    np = None

needs_numpy = pytest.mark.skipif(np is None, reason="numpy not installed")


def test_version_and_library():
    assert radixkv.version() == "0.1.0"
    assert radixkv.library_path().endswith((".so", ".dylib", ".dll"))


def test_status_codes_match_the_c_abi():
    assert [s.value for s in Status] == list(range(13))
    assert radixkv.InvalidLockError.status == Status.INVALID_LOCK
    assert radixkv.IoError.status == Status.IO_ERROR and issubclass(radixkv.IoError, OSError)
    # Each status's name is the C name without the prefix (rkv_status_str starts with it).
    from radixkv._native import lib
    for s in Status:
        assert lib.rkv_status_str(s.value).decode().startswith(f"RKV_{s.name}:")
    assert radixkv.DoubleFreeError.status == Status.DOUBLE_FREE
    for cls in (radixkv.NullArgumentError, radixkv.OutOfSlotsError, radixkv.NoPoolError):
        assert issubclass(cls, radixkv.RadixKvError)


def test_bad_options():
    with pytest.raises(radixkv.InvalidArgumentError) as e:
        Cache(page_size=0)
    assert e.value.status == Status.INVALID_ARGUMENT
    with pytest.raises(radixkv.InvalidArgumentError):
        Cache(page_size=16, pool_slots=100)  # not whole pages
    with pytest.raises(radixkv.InvalidArgumentError):
        Cache(policy="random")
    Cache(policy="FIFO").close()


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"])
def test_every_eviction_policy(policy):
    with Cache(policy=policy, slru_threshold=3) as c:
        assert c.policy == policy
        c.insert([1, 2, 3], [10, 11, 12], priority=5)
        c.insert([7, 8], [20, 21], priority=-1)
        assert sorted(c.evict(10**9)) == [10, 11, 12, 20, 21]
    with pytest.raises(radixkv.InvalidArgumentError, match="priority 4294967296 out of range"):
        Cache().insert([1], [1], priority=1 << 32)


def test_priority_policy_evicts_the_lowest_priority_first():
    with Cache(policy="priority") as c:
        c.insert([1, 2], [10, 11], priority=9)
        c.insert([5, 6], [20, 21], priority=1)
        c.insert([8, 9], [30, 31], priority=5)
        assert sorted(c.evict(1)) == [20, 21]
        assert sorted(c.evict(1)) == [30, 31]


def test_match_insert_roundtrip_page1():
    with Cache() as c:
        assert list(c.match([1, 2, 3])) == []
        assert c.insert([1, 2, 3, 4], [10, 11, 12, 13]) == 0
        assert list(c.match([1, 2, 3, 4, 5])) == [10, 11, 12, 13]
        assert c.match_len([1, 2, 7]) == 2
        assert c.insert([1, 2, 9], [20, 21, 22]) == 2
        assert list(c.match([1, 2, 9])) == [10, 11, 22]
        assert list(c.match([])) == []
        assert c.insert([], []) == 0
        s = c.stats()
        assert s.cached_tokens == 5 and s.evictable_tokens == 5 and s.protected_tokens == 0
        assert s.inserted_tokens == 5 and s.pool_slots == 0 and s.free_slots == 0
        assert s.as_dict()["cached_tokens"] == 5


def test_pages_of_16():
    with Cache(page_size=16) as c:
        toks = list(range(100, 140))
        slots = list(range(1000, 1040))
        assert c.insert(toks, slots) == 0
        assert c.stats().cached_tokens == 32  # the unaligned tail is not cached
        assert list(c.match(toks)) == slots[:32]
        assert list(c.match(toks[:31])) == slots[:16]
        assert c.match_len(toks[:15]) == 0
        freed = c.evict(1)
        assert len(freed) >= 16 and len(freed) % 16 == 0
        rest = c.evict(10**9)
        assert sorted(freed + rest) == slots[:32]  # each slot exactly once


def test_locks():
    with Cache() as c:
        c.insert([1, 2, 3, 4], [10, 11, 12, 13])
        lock = c.match_lock([1, 2, 3, 4, 5])
        assert lock.length == 4 and len(lock) == 4 and list(lock.slots) == [10, 11, 12, 13]
        assert c.stats().protected_tokens == 4
        assert c.evict(100) == []  # everything is pinned
        lock.release()
        assert lock.released
        with pytest.raises(radixkv.InvalidLockError) as e:
            lock.release()  # double release
        assert e.value.status == Status.INVALID_LOCK
        assert c.stats().protected_tokens == 0

        with c.match_lock([1, 2]) as l2:
            assert l2.length == 2 and c.stats().protected_tokens == 2
        assert l2.released and c.stats().protected_tokens == 0

        with c.match_lock([42]) as empty:  # a lock on an empty match is still a lock
            assert empty.length == 0 and list(empty.slots) == [] and empty.handle != 0

        c.match_lock([1, 2, 3])  # dropped at once: garbage collection releases it
        assert c.stats().protected_tokens == 0

        existing, l3 = c.insert_lock([1, 2, 3, 4, 5], [0, 0, 0, 0, 14])
        assert existing == 4 and l3.length == 5
        assert c.stats().protected_tokens == 5
        with l3:
            pass
        assert c.stats().protected_tokens == 0


def test_closing_releases_locks_and_refuses_calls():
    c = Cache()
    c.insert([1, 2], [5, 6])
    lock = c.match_lock([1, 2])
    c.close()
    c.close()  # idempotent
    assert c.closed
    with pytest.raises(radixkv.CacheClosedError):
        c.match([1])
    lock.release()  # freeing the cache released it: a no-op
    with pytest.raises(radixkv.InvalidLockError):
        lock.release()


def test_reset_keeps_pinned():
    with Cache() as c:
        c.insert([1, 2, 3], [1, 2, 3])
        c.insert([7, 8], [7, 8])
        with c.match_lock([1, 2, 3]):
            c.reset()
            assert c.stats().cached_tokens == 3
        c.reset()
        assert c.stats().cached_tokens == 0


def test_reclaim_changes_nothing_cached():
    with Cache() as c:
        c.insert([1, 2, 3], [1, 2, 3])
        c.insert([1, 2, 9], [4, 5, 6])  # splits [1, 2, 3]: the old node is garbage
        before = c.stats()
        c.reclaim()
        assert c.stats() == before
        assert list(c.match([1, 2, 9])) == [1, 2, 6]
    with pytest.raises(radixkv.CacheClosedError):
        c.reclaim()


def test_caller_managed_evict_returns_each_slot_once():
    with Cache() as c:
        c.insert([1, 2, 3, 4], [10, 11, 12, 13])
        c.insert([1, 2, 5, 6], [10, 11, 15, 16])
        c.insert([9], [19], ns=3)
        got = []
        while True:
            freed = c.evict(1)
            if not freed:
                break
            got += freed
        assert sorted(got) == [10, 11, 12, 13, 15, 16, 19]
        assert c.stats().cached_tokens == 0
        with pytest.raises(radixkv.NoPoolError):
            c.alloc(1)
        with pytest.raises(radixkv.NoPoolError):
            c.free([1])


def test_evict_runs_returns_each_slot_once_as_runs():
    with Cache() as c:
        c.insert([1, 2, 3, 4], [10, 11, 12, 13])  # one run
        c.insert([7, 8, 9], [30, 20, 40])  # three runs of one
        runs = c.evict_runs(2**40)
        assert (10, 4) in runs and len(runs) == 4
        slots = sorted(s for start, n in runs for s in range(start, start + n))
        assert slots == [10, 11, 12, 13, 20, 30, 40]
        assert c.evict_runs(1) == [] and c.stats().cached_tokens == 0
        with pytest.raises(ValueError):
            c.evict_runs(-1)
    with Cache(pool_slots=64) as c:
        a = c.alloc(10)
        c.insert(list(range(10)), a)
        runs = c.evict_runs(1)
        assert sorted(s for start, n in runs for s in range(start, start + n)) == sorted(a)
        assert c.stats().free_slots == 64


def test_match_runs_names_the_match_as_runs():
    with Cache() as c:
        c.insert([1, 2, 3, 4, 5, 6], [100, 101, 102, 103, 200, 201])
        assert c.match_runs([1, 2, 3, 4, 5, 6]) == [(100, 4), (200, 2)]
        assert c.match_runs([1, 2, 3, 4, 5, 99]) == [(100, 4), (200, 1)]
        assert c.match_runs([1, 2, 9]) == [(100, 2)]
        assert c.match_runs([7]) == [] and c.match_runs([]) == []
        assert c.match_runs([1, 2, 3], ns="other") == []
        runs = c.match_runs([1, 2, 3, 4, 5, 6])
        assert [s for start, n in runs for s in range(start, start + n)] == list(
            c.match([1, 2, 3, 4, 5, 6])
        )
        assert c.stats().protected_tokens == 0  # pins nothing
        with c.match_lock_runs([1, 2, 3, 4, 5, 99]) as lock:
            assert lock.runs == [(100, 4), (200, 1)] and lock.length == 5
            assert len(lock.slots) == 0 and c.stats().protected_tokens == 5
        assert lock.released and c.stats().protected_tokens == 0
        assert c.match_lock([1, 2]).runs == []
        with pytest.raises(TypeError):
            c.match_runs(["a"])


def test_pool():
    with Cache(pool_slots=64) as c:
        a = c.alloc(10)
        assert isinstance(a, array) and len(set(a)) == 10 and all(0 <= x < 64 for x in a)
        assert c.stats().free_slots == 54
        c.free(a[5:])
        with pytest.raises(radixkv.DoubleFreeError) as e:
            c.free(a[5:6])
        assert e.value.status == Status.DOUBLE_FREE
        with pytest.raises(radixkv.InvalidArgumentError):
            c.free([1000])  # outside the pool
        with pytest.raises(radixkv.OutOfSlotsError):
            c.alloc(60)  # 59 free, nothing evictable
        with pytest.raises(radixkv.OutOfSlotsError):
            c.alloc(10**6)
        assert c.stats().free_slots == 59
        assert c.insert([1, 2, 3, 4, 5], a[:5]) == 0
        with pytest.raises(radixkv.DoubleFreeError):
            c.free(a[:1])  # the tree holds it
        # A duplicate insert with fresh slots adopts nothing; the cache frees them.
        b = c.alloc(5)
        assert c.insert([1, 2, 3, 4, 5], b) == 5
        s = c.stats()
        assert s.free_slots + s.cached_tokens == 64
        # alloc evicts when short.
        everything = c.alloc(64)
        assert sorted(everything) == list(range(64))
        assert c.stats().cached_tokens == 0
        c.free(everything)
        freed = c.evict(10)
        assert freed == []
        assert c.stats().free_slots == 64


@pytest.mark.parametrize("page", [1, 16])
def test_pool_request_flow(page):
    with Cache(page_size=page, pool_slots=256) as c:
        toks = list(range(48))
        with c.match_lock(toks) as hit:
            assert hit.length == 0
            slots = c.alloc(48)
            assert c.insert(toks, slots) == 0
        with c.match_lock(toks + [99] * page) as hit:
            assert hit.length == 48 and list(hit.slots) == list(slots)
            more = c.alloc(page)
            assert c.insert(toks + [99] * page, list(hit.slots) + list(more)) == 48
        s = c.stats()
        assert s.cached_tokens == 48 + page and s.free_slots == 256 - 48 - page


def _expand(runs):
    return [start + i for start, n in runs for i in range(n)]


@pytest.mark.parametrize("page", [1, 4])
def test_pool_request_flow_by_runs(page):
    with Cache(page_size=page, pool_slots=256) as c:
        toks = list(range(48))
        runs = c.alloc_runs(48)
        assert len(_expand(runs)) == 48 and c.stats().free_slots == 256 - 48
        assert c.insert_runs(toks, runs) == 0
        assert list(c.match(toks)) == _expand(runs)
        # The next request pins the 48 by runs, then inserts them plus its own page.
        with c.match_lock_runs(toks + [99] * page) as hit:
            assert hit.length == 48 and _expand(hit.runs) == _expand(runs)
            more = c.alloc_runs(page)
            assert c.insert_runs(toks + [99] * page, list(hit.runs) + more) == 48
        s = c.stats()
        assert s.cached_tokens == 48 + page and s.free_slots == 256 - 48 - page
        # insert_lock_runs pins what it inserted.
        fresh = c.alloc_runs(8 * page)
        e, lock = c.insert_lock_runs([7] * 8 * page, fresh, ns="other")
        assert e == 0 and lock.length == 8 * page and c.stats().protected_tokens == 8 * page
        lock.release()
        # free_runs: spare slots back; refused whole for cached or free slots.
        spare = c.alloc_runs(page)
        with pytest.raises(radixkv.DoubleFreeError):
            c.free_runs(spare + [(runs[0][0], 1)])  # the tree holds that one
        c.free_runs(spare)
        with pytest.raises(radixkv.DoubleFreeError):
            c.free_runs(spare)
        s = c.stats()
        assert s.free_slots + s.cached_tokens == 256


def test_bad_runs_change_nothing():
    with Cache(pool_slots=16) as c:
        (start, n), = c.alloc_runs(4)
        assert n == 4
        before = c.stats()
        for bad in ([(start, 3)], [(start, 2), (start + 2, 0), (start + 2, 2)], [(1000, 4)]):
            with pytest.raises(radixkv.InvalidArgumentError):
                c.insert_runs([1, 2, 3, 4], bad)
            assert c.stats() == before
        with pytest.raises(ValueError):
            c.insert_runs([1], [(-1, 1)])
        with pytest.raises(radixkv.InvalidArgumentError):
            c.free_runs([(start, 0)])  # an empty run
        c.free_runs([(start, 4)])
        assert c.stats().free_slots == 16
    with Cache() as c:
        with pytest.raises(radixkv.NoPoolError):
            c.alloc_runs(1)
        assert c.insert_runs([1, 2, 3], [(40, 2), (9, 1)]) == 0
        assert list(c.match([1, 2, 3])) == [40, 41, 9]


def test_namespaces_are_exact():
    with Cache() as c:
        c.insert([1, 2], [10, 11], ns=0)
        c.insert([1, 2], [20, 21], ns="tenant-a")
        c.insert([1, 2], [30, 31], ns=b"tenant-a")
        c.insert([1, 2], [40, 41], ns=5)
        assert list(c.match([1, 2])) == [10, 11]
        assert list(c.match([1, 2], ns=None)) == [10, 11]
        assert list(c.match([1, 2], ns="tenant-a")) == [20, 21]
        assert list(c.match([1, 2], ns=b"tenant-a")) == [30, 31]
        assert list(c.match([1, 2], ns=5)) == [40, 41]
        assert list(c.match([1, 2], ns="tenant-b")) == []
        assert c.namespace_id("tenant-a") == INTERNED_BASE
        assert c.namespace_id(b"tenant-a") == INTERNED_BASE + 1
        assert c.namespace_id("tenant-a") == INTERNED_BASE  # stable
        for bad in (-1, 1 << 63, 1 << 64):
            with pytest.raises(ValueError):
                c.match([1], ns=bad)
        for bad in (True, 1.5, [1]):
            with pytest.raises(TypeError):
                c.match([1], ns=bad)


def test_array_inputs():
    with Cache() as c:
        c.insert(array("I", [1, 2, 3]), (7, 8, 9))
        assert list(c.match(range(1, 4))) == [7, 8, 9]
        assert list(c.match(iter([1, 2]))) == [7, 8]
        with pytest.raises(ValueError):
            c.match([-1])
        with pytest.raises(ValueError):
            c.match([1 << 32])
        with pytest.raises(TypeError):
            c.match(b"\x01\x00\x00\x00")
        with pytest.raises(TypeError):
            c.match([1.5])
        with pytest.raises(radixkv.InvalidArgumentError):
            c.insert([1, 2], [1])


def test_array_is_copied_under_the_gil():
    a = array("I", [5, 6, 7])
    got = as_u32(a)
    # Copied while the GIL is held (another thread could write a writable array while a
    # call runs without the GIL): not read in place, and not left exported.
    assert got.n == 3 and got.ptr is None
    a.append(8)
    del got


@needs_numpy
def test_numpy_inputs():
    arr = np.arange(10, 20, dtype=np.uint32)
    got = as_u32(arr)
    assert got.ptr is None and got.n == 10  # copied under the GIL
    del got
    with Cache() as c:
        assert c.insert(arr, arr + 100) == 0
        assert list(c.match(arr)) == list(range(110, 120))
        assert list(c.match(arr.astype(np.int64))) == list(range(110, 120))  # converted
        assert list(c.match(arr[::2])) == [110]  # non-contiguous: copied
        ro = arr.copy()
        ro.setflags(write=False)
        assert c.match_len(ro) == 10  # read-only: copied
        assert c.match_len(arr.astype(">u4")) == 10  # other byte order: converted
        with pytest.raises(ValueError):
            c.match(np.array([-1, 2], dtype=np.int64))
        with pytest.raises(TypeError):
            c.match(np.array([1.5]))
        assert np.frombuffer(c.match(arr), dtype=np.uint32).tolist() == list(range(110, 120))
        assert c.match_len(np.zeros(0, dtype=np.uint32)) == 0


def test_loading_honours_radixkv_lib(tmp_path):
    import os
    import subprocess
    import sys

    code = "import radixkv; print(radixkv.library_path())"
    env = dict(os.environ, RADIXKV_LIB=str(tmp_path / "nope.so"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "RADIXKV_LIB" in r.stderr
    libdir = os.path.dirname(radixkv.library_path())
    env = dict(os.environ, RADIXKV_LIB=libdir)  # a directory works too
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == radixkv.library_path()


# ---- found by an audit of the package ----------------------------------------------


def test_cache_and_lock_cannot_be_copied_or_pickled():
    # A shallow copy used to share the native pointer: the first to close freed it under
    # the other (a use after free, then a crash).
    import copy
    import pickle

    c = Cache()
    lock = c.match_lock([1, 2])
    for make in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError):
            make(c)
        with pytest.raises(TypeError):
            make(lock)
    lock.release()
    c.insert([1, 2], [5, 6])
    assert list(c.match([1, 2])) == [5, 6]
    c.close()


def test_close_is_not_starved_by_busy_threads():
    # close() used to wait for running calls while admitting new ones, so threads calling in
    # a loop kept it waiting for ever; now it refuses new calls at once.
    import threading

    c = Cache()
    c.insert(list(range(64)), list(range(64)))
    started = threading.Barrier(3)
    errors = []

    def busy():
        started.wait()
        try:
            while True:
                c.match(list(range(64)))
        except radixkv.CacheClosedError:
            pass
        except Exception as e:  # anything else is a failure
            errors.append(e)

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait()
    closer = threading.Thread(target=c.close, daemon=True)
    closer.start()
    closer.join(timeout=60)
    assert not closer.is_alive(), "close() is starved by the busy threads"
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    assert c.closed and not errors


def test_counts_must_be_integers():
    c = Cache(pool_slots=8)
    for bad in (2.5, "2", True, None):
        with pytest.raises(TypeError):
            c.alloc(bad)
        with pytest.raises(TypeError):
            c.evict(bad)
    for bad in (1.7, True):
        with pytest.raises(TypeError):
            Cache(page_size=bad)
        with pytest.raises(TypeError):
            Cache(pool_slots=bad)
    assert c.stats().free_slots == 8
    # Integer types other than int are fine.
    if np is not None:
        assert len(c.alloc(np.int64(2))) == 2
    # The count in an error is the one asked for, not a clamped one.
    with pytest.raises(radixkv.OutOfSlotsError, match=str(2**70)):
        c.alloc(2**70)
    assert c.evict(2**70) == []  # "as many as there are": nothing cached


@needs_numpy
def test_misaligned_numpy_arrays_are_copied():
    raw = np.zeros(4 * 9, dtype=np.uint8)
    view = raw[1 : 1 + 4 * 8].view(np.uint32)  # contiguous, writable, at an odd address
    view[:] = np.arange(8, dtype=np.uint32)
    assert view.flags.c_contiguous and view.flags.writeable
    assert view.ctypes.data % 4 != 0
    c = Cache()
    c.insert(view, view + 100)
    assert list(c.match(view)) == list(range(100, 108))
