"""radixkv.TieredCache: the host tier (SGLang HiCache's semantics) from Python: each write
policy's cycle, bytes loaded back equal to the bytes written (copier "host"), host_len,
too-short load-backs, bad input refused with nothing changed, threads."""

import random
import struct
import threading

import pytest

import radixkv
from radixkv import KvLayout, TieredCache

# TieredCache is deprecated (it warns): these are its compatibility tests (the tier through
# Cache: test_cache_host.py).
pytestmark = pytest.mark.filterwarnings("ignore:radixkv.TieredCache is deprecated:DeprecationWarning")

P = 4
LAYERS = 2
LAYOUT = KvLayout(num_layers=LAYERS, num_kv_heads=1, head_dim=2, elem_bytes=4)  # 8-byte slots


def pattern(t, layer, v):
    x = (t * 2654435761 + layer * 7 + v) & 0xFFFFFFFF
    return struct.pack("<I", x) * 2


def make(policy, dev=32, host=64, **kw):
    return TieredCache(
        page_size=P,
        pool_slots=dev,
        host_slots=host,
        write_policy=policy,
        copier="host",
        kv_layout=LAYOUT,
        **kw,
    )


def request(c, tokens):
    """The request cycle: match, allocate the rest, write its KV, insert, release."""
    with c.match_and_lock(tokens) as lk:
        fresh = c.alloc(len(tokens) - lk.device_len)
        for i, s in enumerate(fresh):
            t = tokens[lk.device_len + i]
            for layer in range(LAYERS):
                c.write_slot(s, layer, pattern(t, layer, 0), pattern(t, layer, 1))
        c.insert(tokens, list(lk.slots) + list(fresh))
        return lk.device_len


def assert_bytes(c, slots, tokens):
    assert len(slots) == len(tokens)
    for s, t in zip(slots, tokens):
        for layer in range(LAYERS):
            k, v = c.read_slot(s, layer)
            assert k == pattern(t, layer, 0), (s, t, layer)
            assert v == pattern(t, layer, 1), (s, t, layer)


def scribble(c):
    """Overwrites every free device slot, so a load-back must really copy."""
    junk = c.alloc(c.stats().device.free_slots)
    for s in junk:
        for layer in range(LAYERS):
            c.write_slot(s, layer, b"\xee" * 8, b"\xee" * 8)
    c.free(junk)


def counts(st):
    """The counts a refused call must leave as they were (counters such as match calls
    may move)."""
    d = st.device
    return (
        d.cached_tokens,
        d.evictable_tokens,
        d.protected_tokens,
        d.free_slots,
        st.host_backed_slots,
        st.host_free_slots,
        st.host_pinned_pages,
        st.host_resident_pages,
    )


def key(start, n):
    return list(range(start, start + n))


@pytest.mark.parametrize("policy", radixkv.WRITE_POLICIES)
def test_full_cycle_loads_back_the_bytes_written(policy):
    c = make(policy)
    a = key(100, 16)
    request(c, a)
    if policy == "write_through_selective":
        request(c, a)  # the second hit backs it up
    c.wait_all()
    st = c.stats()
    if policy == "write_back":
        assert st.host_backed_slots == 0 and st.tokens_to_host == 0
    else:
        assert st.host_backed_slots == 16 and st.host_resident_pages == 4
    c.check()
    assert c.evict(1 << 40) == 16
    c.wait_all()
    st = c.stats()
    assert st.device.cached_tokens == 0
    assert st.host_backed_slots == 16 and st.host_resident_pages == 0
    assert st.tokens_written_back == (16 if policy == "write_back" else 0)
    scribble(c)
    m = c.match_prefix(a)
    assert (m.device_len, m.host_len, list(m.slots)) == (0, 16, [])
    done = c.wait_load(c.load_back(a))
    assert done.outcome == "loaded"
    assert (done.device_len, done.loaded, done.lock.length) == (0, 16, 16)
    assert_bytes(c, done.slots, a)
    done.lock.release()
    m = c.match_prefix(a)
    assert (m.device_len, m.host_len) == (16, 0)
    st = c.stats()
    assert st.load_backs == 1 and st.tokens_to_device == 16 and st.host_resident_pages == 4
    c.check()
    c.close()


def test_host_len_extends_a_partial_device_match_and_load_back_keeps_the_prefix():
    c = make("write_through", dev=32, host=64)
    a = key(0, 12)
    request(c, a)
    c.wait_all()
    c.evict(1 << 40)
    b = a[:4]
    assert request(c, b) == 0  # page 0 back on the device (a fresh copy of the same bytes)
    c.wait_all()
    m = c.match_prefix(a + [999])
    assert (m.device_len, m.host_len) == (4, 8)
    scribble(c)
    done = c.wait_load(c.load_back(a + [999], max_tokens=4))
    assert (done.device_len, done.loaded, done.outcome) == (4, 4, "loaded")
    assert_bytes(c, done.slots, a[:8])
    done.lock.release()
    assert c.match_prefix(a).host_len == 4
    c.check()


def test_too_short_and_nothing_on_host_change_nothing():
    c = make("write_through", load_back_min=8)
    a = key(50, 4)
    request(c, a)
    c.wait_all()
    c.evict(1 << 40)
    before = c.stats()
    done = c.wait_load(c.load_back(a))
    assert (done.outcome, done.loaded, done.device_len, done.lock.length) == ("too_short", 0, 0, 0)
    done.lock.release()
    done = c.wait_load(c.load_back(key(7000, 8)))
    assert done.outcome == "nothing_on_host"
    done.lock.release()
    after = c.stats()
    assert after.load_backs_skipped == before.load_backs_skipped + 2
    assert counts(after) == counts(before)
    assert c.match_prefix(a).host_len == 4
    c.check()


def test_try_load_and_a_ticket_taken_twice():
    c = make("write_through")
    a = key(1, 8)
    request(c, a)
    c.wait_all()
    c.evict(1 << 40)
    t = c.load_back(a)
    got = c.try_load(t)  # HostCopier copies at once: done when polled
    assert got is not None and got.loaded == 8
    got.lock.release()
    with pytest.raises(radixkv.InvalidArgumentError):
        c.wait_load(t)
    assert c.try_load(t) is None
    with pytest.raises(TypeError):
        c.wait_load(1)
    c.check()


def test_host_eviction_takes_host_only_leaves_and_publishes_cpu_pinned():
    c = make("write_through", events=True)
    a = key(300, 8)
    request(c, a)
    c.wait_all()
    assert c.evict_host(1 << 40) == 0  # resident on the device: not evictable
    c.evict(1 << 40)
    assert c.stats().host_evictable_pages == 1  # the leaf only
    assert c.evict_host(1 << 40) == 8
    st = c.stats()
    assert st.host_backed_slots == 0 and st.host_evicted_pages == 2
    assert c.match_prefix(a).host_len == 0
    c.flush_events()
    evs = list(c.events())
    media = {(type(e).__name__, e.medium) for e in evs}
    assert ("BlockStored", "GPU") in media
    assert ("BlockStored", "CPU_PINNED") in media
    assert ("BlockRemoved", "CPU_PINNED") in media
    assert ("BlockRemoved", "GPU") in media
    c.check()


def test_copier_none_keeps_the_index_only():
    c = TieredCache(page_size=2, pool_slots=8, host_slots=8, write_policy="write-through")
    assert c.write_policy == "write_through"
    s = c.alloc(4)
    c.insert([1, 2, 3, 4], s)
    c.wait_all()
    c.evict(8)
    assert c.match_prefix([1, 2, 3, 4]).host_len == 4
    done = c.wait_load(c.load_back([1, 2, 3, 4]))
    assert done.loaded == 4
    done.lock.release()
    assert c.kv_pointers is not None
    with pytest.raises(radixkv.InvalidArgumentError, match="no KV bytes"):
        c.read_slot(0, 0)
    c.check()


def test_kv_pointers_and_layout():
    c = make("write_back")
    ptrs = c.kv_pointers("device")
    hp = c.kv_pointers("host")
    assert len(ptrs) == LAYERS and len(hp) == LAYERS
    assert all(k and v and k != v for k, v in ptrs + hp)
    assert set(ptrs).isdisjoint(hp)
    with pytest.raises(radixkv.InvalidArgumentError, match="side"):
        c.kv_pointers("gpu")
    with pytest.raises(radixkv.InvalidArgumentError):
        c.write_slot(0, 0, b"short", b"short")
    with pytest.raises(radixkv.InvalidArgumentError):
        c.read_slot(32, 0)  # beyond the device store
    c.read_slot(63, 0, side="host")


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(pool_slots=0), "pool"),
        (dict(host_slots=0), "host_slots"),
        (dict(host_slots=6), "host_slots"),
        (dict(write_policy="write_around"), "write policy"),
        (dict(write_threshold=0), "write_threshold"),
        (dict(policy="nope"), "policy"),
        (dict(host_policy="nope"), "host_policy"),
        (dict(copier="cuda"), "copier"),
        (dict(copier="host"), "kv_layout"),
        (dict(copier="none", kv_layout=LAYOUT), "kv_layout"),
        (dict(copier="host", kv_layout=(0, 1, 1, 1)), "kv_layout"),
    ],
)
def test_bad_options_are_refused(kw, match):
    base = dict(page_size=P, pool_slots=16, host_slots=16)
    base.update(kw)
    with pytest.raises(radixkv.InvalidArgumentError, match=match):
        TieredCache(**base)


def test_bad_calls_are_refused_and_change_nothing():
    c = make("write_through", dev=16, host=16)
    request(c, key(0, 8))
    c.wait_all()
    before = c.stats()
    s = c.alloc(4)
    with pytest.raises(radixkv.InvalidArgumentError):
        c.insert(key(90, 4), list(s)[:3])  # lengths differ
    with pytest.raises(radixkv.InvalidArgumentError):
        c.insert(key(90, 4), [s[1], s[0], s[2], s[3]])  # not one whole pool page
    with pytest.raises(ValueError):
        c.insert(key(90, 3) + [-1], s)
    with pytest.raises(radixkv.OutOfSlotsError):
        c.alloc(17)
    with pytest.raises(TypeError):
        c.evict(1.5)
    with pytest.raises(radixkv.InvalidArgumentError):
        c.insert(key(90, 4), s, priority=1 << 40)
    c.free(s)
    with pytest.raises(radixkv.DoubleFreeError):
        c.free(s)
    assert counts(c.stats()) == counts(before)
    c.check()
    lk = c.match_and_lock(key(0, 8))
    lk.release()
    with pytest.raises(radixkv.InvalidLockError):
        lk.release()
    c.close()
    with pytest.raises(radixkv.CacheClosedError):
        c.match_prefix([1])


def test_load_back_when_the_device_cannot_hold_it_changes_nothing():
    c = make("write_through", dev=16, host=32)
    a = key(0, 16)
    request(c, a)
    c.wait_all()
    c.evict(1 << 40)
    request(c, a[:8])
    c.wait_all()
    lk = c.match_and_lock(a[:8])  # pins a[:8]
    held = c.alloc(8)  # and the rest of the pool is held
    m = c.match_prefix(a)
    assert (m.device_len, m.host_len) == (8, 8)
    before = c.stats()
    with pytest.raises(radixkv.OutOfSlotsError):
        c.load_back(a)
    assert counts(c.stats()) == counts(before)
    c.free(held)
    lk.release()
    done = c.wait_load(c.load_back(a))  # now it fits
    assert (done.device_len, done.loaded) == (8, 8)
    assert_bytes(c, done.slots, a)
    done.lock.release()
    c.check()


def test_threads_conserve_slots_and_bytes():
    c = make("write_through_selective", dev=64, host=128)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        try:
            for _ in range(150):
                toks = key(rng.randrange(4) * 1000, 8) + key(rng.randrange(3) * 100 + 50, rng.randrange(1, 3) * P)
                lk = c.match_and_lock(toks)
                locks = [lk]
                slots = list(lk.slots)
                if lk.host_len and rng.random() < 0.7:
                    done = c.wait_load(c.load_back(toks))
                    locks.append(done.lock)
                    assert_bytes(c, done.slots, toks[: len(done.slots)])
                    slots = list(done.slots)
                try:
                    fresh = c.alloc(len(toks) - len(slots))
                except radixkv.OutOfSlotsError:
                    for lock in locks:
                        lock.release()
                    continue
                for i, s in enumerate(fresh):
                    t = toks[len(slots) + i]
                    for layer in range(LAYERS):
                        c.write_slot(s, layer, pattern(t, layer, 0), pattern(t, layer, 1))
                c.insert(toks, slots + list(fresh))
                for lock in locks:
                    lock.release()
                if rng.random() < 0.2:
                    c.evict(rng.randrange(1, 32))
                if rng.random() < 0.05:
                    c.evict_host(P)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    c.wait_all()
    c.check()
    st = c.stats()
    assert st.device.free_slots + st.device.cached_tokens == 64
    assert st.host_free_slots + st.host_backed_slots == 128
    assert st.tokens_to_host > 0 and st.load_backs > 0
