"""Several Python threads on one cache: ctypes.CDLL releases the GIL during each call, so
they really run at once inside the library. Slots must be conserved."""

import random
import threading

import pytest

import radixkv
from radixkv import Cache
from radixkv._cache import as_u32

THREADS = 8
ROUNDS = 400


def _worker(cache, seed, held, errors):
    rng = random.Random(seed)
    locks = []
    try:
        for _ in range(ROUNDS):
            ns = rng.choice([0, "lora-a", b"salt"])
            prompt = rng.randrange(4)
            toks = [prompt * 1000 + i for i in range(16)] + [rng.randrange(6) for _ in range(rng.randrange(1, 24))]
            with cache.match_lock(toks, ns=ns) as hit:
                assert len(hit.slots) == hit.length
                try:
                    fresh = cache.alloc(len(toks) - hit.length)
                except radixkv.OutOfSlotsError:
                    continue
                slots = list(hit.slots) + list(fresh)
                if rng.random() < 0.25:
                    existing, lock = cache.insert_lock(toks, slots, ns=ns)
                    assert existing >= hit.length and lock.length == len(toks)
                    locks.append(lock)
                else:
                    assert cache.insert(toks, slots, ns=ns) >= hit.length
            with pytest.raises(radixkv.InvalidLockError):
                hit.release()
            if len(locks) > 3:
                locks.pop(0).release()
            r = rng.random()
            if r < 0.1:
                cache.evict(rng.randrange(1, 64))
            elif r < 0.2:
                try:
                    held.extend(cache.alloc(rng.randrange(1, 4)))
                except radixkv.OutOfSlotsError:
                    pass
            elif r < 0.3 and held:
                k = rng.randrange(1, len(held) + 1)
                back, held[:] = held[-k:], held[:-k]
                cache.free(back)
    except BaseException as e:  # reported by the main thread
        errors.append(e)
    finally:
        for lock in locks:
            lock.release()


def test_threads_conserve_slots():
    pool = 4096
    with Cache(pool_slots=pool) as cache:
        held = [[] for _ in range(THREADS)]
        errors = []
        threads = [
            threading.Thread(target=_worker, args=(cache, i, held[i], errors)) for i in range(THREADS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        all_held = [s for h in held for s in h]
        assert len(set(all_held)) == len(all_held)  # no slot handed out twice
        s = cache.stats()
        assert s.protected_tokens == 0
        assert s.free_slots + s.cached_tokens + len(all_held) == pool
        cache.free(all_held)
        freed = cache.evict(10**9)
        assert len(set(freed)) == len(freed)
        s = cache.stats()
        assert s.cached_tokens == 0 and s.free_slots == pool


def test_concurrent_release_of_one_handle_succeeds_once():
    from radixkv._native import lib

    with Cache(page_size=4) as cache:
        cache.insert(list(range(64)), list(range(64)))
        locks = [cache.match_lock(list(range(64))) for _ in range(200)]
        handles = [lock.handle for lock in locks]
        assert len(set(handles)) == len(handles)
        results = []

        def release_all():
            # Straight to the C ABI: every thread tries every handle.
            results.append([lib.rkv_release(cache._ptr, h) for h in handles])

        threads = [threading.Thread(target=release_all) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(len(handles)):
            codes = sorted(r[i] for r in results)
            assert codes == [0, 3, 3, 3]  # RKV_OK once, RKV_INVALID_LOCK for the others
        assert cache.stats().protected_tokens == 0
        for lock in locks:
            lock._released = True  # released above, behind the objects' backs


def test_a_numpy_array_written_by_another_thread_is_read_as_one_consistent_copy():
    """A call copies a caller's buffer while it holds the GIL and reads only the copy with
    the GIL released, so a thread writing the array meanwhile cannot change what the call
    sees: each result is the result for one state the array was in."""
    np = pytest.importorskip("numpy")
    n = 2048
    a = np.arange(n, dtype=np.uint32)  # state A
    b = a + n  # state B: every token differs, the first one too
    sa, sb = a + 10 * n, a + 20 * n  # their slots
    key = a.copy()  # written element by element by the writer: B[:p] + A[p:] or A[:p] + B[p:]
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            for src in (b, a):
                for i in range(n):
                    key[i] = src[i]

    with Cache() as c:
        c.insert(a, sa)
        c.insert(b, sb)
        w = threading.Thread(target=writer)
        w.start()
        try:
            for _ in range(300):
                got = np.frombuffer(c.match(key), dtype=np.uint32)
                m = len(got)
                # A state B[:p] + A[p:] matches B's first p tokens (all of A when p = 0), a
                # state A[:p] + B[p:] A's first p (all of B when p = 0): the slots are one
                # key's prefix, never a mix.
                assert 1 <= m <= n
                assert np.array_equal(got, sa[:m]) or np.array_equal(got, sb[:m]), m
                # An insert of the moving key adopts a consistent state too: afterwards the
                # key it saw is cached with the given slots, position by position.
                with Cache() as d:
                    snap_slots = a + 30 * n
                    assert d.insert(key, snap_slots) == 0
                    assert d.stats().cached_tokens == n
                    assert np.array_equal(np.frombuffer(d.match(a), dtype=np.uint32),
                                          snap_slots[: len(d.match(a))])
        finally:
            stop.set()
            w.join()
    # Not read in place: a writable array is copied (see radixkv._radixkv.borrow).
    assert as_u32(key).ptr is None
