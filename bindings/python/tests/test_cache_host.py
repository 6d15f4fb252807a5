"""The host tier through radixkv.Cache (``Cache(..., host=HostOptions(...))``): the request
cycle with load-back, bytes loaded back equal to the bytes written, the plain Cache calls
on a host-tier cache, the forms ``host=`` takes, bad options refused, NoTierError on a
cache without a tier (nothing changed), and TieredCache as a deprecated wrapper."""

import struct
import warnings

import pytest

import radixkv
from radixkv import Cache, HostOptions, KvLayout, NoTierError

P = 4
LAYERS = 2
LAYOUT = KvLayout(num_layers=LAYERS, num_kv_heads=1, head_dim=2, elem_bytes=4)  # 8-byte slots


def pattern(t, layer, v):
    x = (t * 2654435761 + layer * 7 + v) & 0xFFFFFFFF
    return struct.pack("<I", x) * 2


def make(policy="write_through", dev=32, host=64, **kw):
    return Cache(
        page_size=P,
        pool_slots=dev,
        host=HostOptions(host_slots=host, write_policy=policy, copier="host", kv_layout=LAYOUT),
        **kw,
    )


def key(start, n):
    return list(range(start, start + n))


def request(c, tokens):
    """The request cycle through Cache: lookup_lock, allocate the rest, write its KV,
    insert, release."""
    with c.lookup_lock(tokens) as lk:
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
            assert c.read_slot(s, layer) == (pattern(t, layer, 0), pattern(t, layer, 1)), (s, t, layer)


def scribble(c):
    junk = c.alloc(c.stats().free_slots)
    for s in junk:
        for layer in range(LAYERS):
            c.write_slot(s, layer, b"\xee" * 8, b"\xee" * 8)
    c.free(junk)


@pytest.mark.parametrize("policy", radixkv.WRITE_POLICIES)
def test_the_cycle_through_cache_loads_back_the_bytes_written(policy):
    c = make(policy)
    assert c.has_tier and c.host.write_policy == policy and c.host.host_slots == 64
    a = key(100, 16)
    assert request(c, a) == 0
    if policy == "write_through_selective":
        assert request(c, a) == 16  # the second hit backs it up
    c.wait_all()
    st = c.tier_stats()
    assert st.host_backed_slots == (0 if policy == "write_back" else 16)
    c.check_tier()
    freed = c.evict(1 << 40)  # the device slots, back in the pool
    assert sorted(freed) == sorted(set(freed)) and len(freed) == 16
    c.wait_all()
    st = c.tier_stats()
    assert st.device.cached_tokens == 0 and st.host_backed_slots == 16
    assert st.tokens_written_back == (16 if policy == "write_back" else 0)
    assert c.match(a) == []  # the device alone has nothing
    scribble(c)
    m = c.lookup(a)
    assert (m.device_len, m.host_len, list(m.slots)) == (0, 16, [])
    done = c.wait_load(c.load_back(a))
    assert (done.outcome, done.device_len, done.loaded, done.lock.length) == ("loaded", 0, 16, 16)
    assert_bytes(c, done.slots, a)
    done.lock.release()
    m = c.lookup(a)
    assert (m.device_len, m.host_len) == (16, 0)
    assert list(m.slots) == list(done.slots) == list(c.match(a))
    st = c.tier_stats()
    assert st.load_backs == 1 and st.tokens_to_device == 16
    assert c.stats().cached_tokens == 16
    c.check_tier()
    c.close()
    with pytest.raises(radixkv.CacheClosedError):
        c.lookup(a)


def test_lookup_lock_pins_the_device_prefix_and_reports_host_len():
    c = make(dev=32, host=64)
    a = key(0, 12)
    request(c, a)
    c.wait_all()
    c.evict(1 << 40)
    assert request(c, a[:4]) == 0
    c.wait_all()
    lk = c.lookup_lock(a + [999])
    assert isinstance(lk, radixkv.TierLock) and isinstance(lk, radixkv.Lock)
    assert (lk.device_len, lk.host_len, lk.length) == (4, 8, 4)
    assert c.stats().protected_tokens == 4
    assert c.evict(1 << 40) == []  # pinned: nothing evictable on the device
    lk.release()
    assert c.stats().protected_tokens == 0
    with pytest.raises(radixkv.InvalidLockError):
        lk.release()
    t = c.load_back(a, max_tokens=4)
    got = c.try_load(t)  # HostCopier copies at once: done when polled
    assert got is not None and (got.device_len, got.loaded) == (4, 4)
    got.lock.release()
    assert c.try_load(t) is None  # taken
    with pytest.raises(radixkv.InvalidArgumentError):
        c.wait_load(t)
    with pytest.raises(TypeError):
        c.wait_load(t.id)
    c.check_tier()


def test_the_plain_cache_calls_work_on_a_host_tier_cache():
    c = Cache(page_size=2, pool_slots=16, host=HostOptions(host_slots=16, write_policy="write_through"), events=True)
    runs = c.alloc_runs(4)
    assert c.insert_runs([1, 2, 3, 4], runs, ns="t") == 0
    assert c.match_len([1, 2, 3, 4], ns="t") == 4
    assert c.match_runs([1, 2, 3, 4], ns="t") == runs
    assert c.lookup([1, 2, 3, 4], ns="t").device_len == 4
    assert c.lookup([1, 2, 3, 4]).device_len == 0  # another namespace
    c.wait_all()
    assert c.namespace_stats("t").cached_tokens == 4
    assert c.drop_namespace("t") == 4
    assert c.lookup([1, 2, 3, 4], ns="t").host_len == 4  # the host copy stays
    c.flush_events()
    media = {(type(e).__name__, e.medium) for e in c.events()}
    assert {("BlockStored", "GPU"), ("BlockStored", "CPU_PINNED"), ("BlockRemoved", "GPU")} <= media
    assert c.evict_host(1 << 40) == 4
    assert c.lookup([1, 2, 3, 4], ns="t").host_len == 0
    st = c.tier_stats()
    assert st.host_backed_slots == 0 and st.device.free_slots == 16
    assert "host_slots=16" in repr(c)
    c.check_tier()


@pytest.mark.parametrize(
    "host",
    [
        HostOptions(host_slots=8, write_policy="write-through"),
        dict(host_slots=8, write_policy="write_through"),
    ],
)
def test_host_takes_options_or_a_dict(host):
    c = Cache(page_size=2, pool_slots=8, host=host)
    assert c.host == HostOptions(host_slots=8, write_policy="write_through")
    s = c.alloc(4)
    c.insert([1, 2, 3, 4], s)
    c.wait_all()
    c.evict(8)
    assert c.lookup([1, 2, 3, 4]).host_len == 4


def test_host_as_the_host_slots_int_takes_the_defaults():
    c = Cache(page_size=2, pool_slots=8, host=8)
    assert c.host == HostOptions(host_slots=8)
    assert c.host.write_policy == "write_through_selective"


def test_kv_layout_as_a_tuple_is_a_kv_layout():
    c = Cache(page_size=P, pool_slots=8, host=dict(host_slots=8, copier="host", kv_layout=(2, 1, 2, 4)))
    assert c.host.kv_layout == LAYOUT
    assert len(c.kv_pointers("host")) == LAYERS


@pytest.mark.parametrize(
    "kw, host, err, match",
    [
        (dict(pool_slots=0), dict(), radixkv.InvalidArgumentError, "device pool"),
        (dict(), dict(host_slots=0), radixkv.InvalidArgumentError, "host_slots"),
        (dict(), dict(host_slots=6), radixkv.InvalidArgumentError, "host_slots"),
        (dict(), dict(write_policy="write_around"), radixkv.InvalidArgumentError, "write policy"),
        (dict(), dict(write_threshold=0), radixkv.InvalidArgumentError, "write_threshold"),
        (dict(), dict(host_policy="nope"), radixkv.InvalidArgumentError, "host_policy"),
        (dict(), dict(copier="cuda"), radixkv.InvalidArgumentError, "copier"),
        (dict(), dict(copier="host"), radixkv.InvalidArgumentError, "kv_layout"),
        (dict(), dict(kv_layout=LAYOUT), radixkv.InvalidArgumentError, "kv_layout"),
        (dict(), dict(copier="host", kv_layout=(0, 1, 1, 1)), radixkv.InvalidArgumentError, "kv_layout"),
        (dict(), dict(write_policy=3), radixkv.InvalidArgumentError, "host.write_policy"),
        (dict(), dict(host_slots=-1), ValueError, "host.host_slots"),
        (dict(), dict(host_slots=1.5), TypeError, "host.host_slots"),
        (dict(), dict(bogus=1), TypeError, "host:"),
    ],
)
def test_bad_host_options_are_refused(kw, host, err, match):
    base = dict(page_size=P, pool_slots=16)
    base.update(kw)
    opts = dict(host_slots=16)
    opts.update(host)
    with pytest.raises(err, match=match):
        Cache(host=opts, **base)


@pytest.mark.parametrize("host", ["16", 1.0, True, [16]])
def test_host_of_another_type_is_a_type_error(host):
    with pytest.raises(TypeError, match="host must be a HostOptions"):
        Cache(page_size=P, pool_slots=16, host=host)


TIER_ONLY = [
    ("load_back", lambda c: c.load_back([1, 2, 3, 4])),
    ("wait_load", lambda c: c.wait_load(radixkv.LoadTicket(1))),
    ("try_load", lambda c: c.try_load(radixkv.LoadTicket(1))),
    ("evict_host", lambda c: c.evict_host(4)),
    ("tier_stats", lambda c: c.tier_stats()),
    ("check_tier", lambda c: c.check_tier()),
    ("read_slot", lambda c: c.read_slot(0, 0)),
    ("write_slot", lambda c: c.write_slot(0, 0, b"", b"")),
    ("kv_pointers", lambda c: c.kv_pointers()),
]


@pytest.mark.parametrize("name, call", TIER_ONLY, ids=[n for n, _ in TIER_ONLY])
def test_a_cache_without_a_tier_refuses_the_tier_calls_with_no_tier(name, call):
    c = Cache(page_size=P, pool_slots=16)
    s = c.alloc(4)
    c.insert([1, 2, 3, 4], s)
    before = c.stats()
    assert not c.has_tier and c.host is None
    with pytest.raises(NoTierError, match=rf"^Cache\.{name}: this cache has no host tier") as e:
        call(c)
    assert isinstance(e.value, radixkv.InvalidArgumentError)
    assert e.value.status == radixkv.Status.INVALID_ARGUMENT
    after = c.stats()
    assert (after.cached_tokens, after.free_slots, after.protected_tokens) == (
        before.cached_tokens,
        before.free_slots,
        before.protected_tokens,
    )


def test_a_cache_without_a_tier_looks_up_with_host_len_zero():
    c = Cache(page_size=2, pool_slots=8)
    c.insert([1, 2, 3, 4], c.alloc(4))
    m = c.lookup([1, 2, 3, 4, 5])
    assert (m.device_len, m.host_len, list(m.slots)) == (4, 0, list(c.match([1, 2, 3, 4])))
    with c.lookup_lock([1, 2, 9]) as lk:
        assert (lk.device_len, lk.host_len) == (2, 0)
        assert c.stats().protected_tokens == 2
    assert c.stats().protected_tokens == 0
    assert c.poll() == 0
    c.wait_all()  # nothing in flight: nothing to do


def test_a_copier_none_cache_has_no_kv_bytes():
    c = Cache(page_size=2, pool_slots=8, host=8)
    with pytest.raises(radixkv.InvalidArgumentError, match="no KV bytes") as e:
        c.read_slot(0, 0)
    assert not isinstance(e.value, NoTierError)


def test_tiered_cache_is_a_deprecated_wrapper_over_cache():
    with pytest.warns(DeprecationWarning, match="TieredCache is deprecated"):
        t = radixkv.TieredCache(page_size=2, pool_slots=8, host_slots=8, write_policy="write-through")
    assert isinstance(t.cache, Cache) and t.cache.has_tier
    assert t.write_policy == "write_through"
    s = t.alloc(4)
    t.insert([1, 2, 3, 4], s)
    t.wait_all()
    assert t.evict(8) == 4
    assert t.cache.lookup([1, 2, 3, 4]).host_len == t.match_prefix([1, 2, 3, 4]).host_len == 4
    assert t.stats() == t.cache.tier_stats()
    t.close()
    assert t.cache.closed


def test_cache_itself_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Cache(page_size=2, pool_slots=8, host=8).close()
