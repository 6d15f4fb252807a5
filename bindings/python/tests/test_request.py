"""radixkv.Request (Cache.admit): the engine's cycle as one object: admit, extend,
checkpoint, finish, abort; slots conserved; refusals with nothing changed; requests aborted
when the cache closes; threads."""

import threading

import pytest

import radixkv
from radixkv import Cache


def conserved(c, held):
    s = c.stats()
    assert s.free_slots + s.cached_tokens + held == s.pool_slots, s


def test_admit_extend_checkpoint_finish():
    c = Cache(page_size=4, pool_slots=64)
    prompt = list(range(1, 11))
    r = c.admit(prompt)
    assert (len(r), r.cached_len, r.locked_len, len(r.slots)) == (10, 0, 0, 10)
    conserved(c, 12)  # 3 pages held
    assert r.checkpoint() == 0
    assert r.locked_len == 8 and c.stats().protected_tokens == 8
    r2 = c.admit(prompt)  # sees the checkpointed prefix
    assert r2.cached_len == 8 and list(r2.slots[:8]) == list(r.slots[:8])
    r.extend([11, 12, 13])
    assert len(r) == 13 and len(r.slots) == 13
    slots = list(r.slots)
    assert r.finish() == 8
    assert r.done and c.stats().cached_tokens == 12
    assert r2.finish() == 8
    conserved(c, 0)
    assert list(c.match(list(range(1, 14)))) == slots[:12]
    with pytest.raises(radixkv.InvalidArgumentError, match=r"^Request.finish: request \d+ is finished"):
        r.finish()
    with pytest.raises(radixkv.InvalidArgumentError, match="^Request.extend: "):
        r.extend([1])


def test_abort_and_an_unfinished_request_give_everything_back():
    c = Cache(page_size=4, pool_slots=64)
    c.insert(list(range(8)), c.alloc(8))
    r = c.admit(list(range(20)), ns=0)
    assert r.cached_len == 8 and c.stats().protected_tokens == 8
    r.abort()
    assert r.done and c.stats().protected_tokens == 0
    conserved(c, 0)
    with pytest.raises(radixkv.InvalidArgumentError, match="^Request.abort: "):
        r.abort()
    with c.admit(list(range(20))) as r:  # left unfinished: aborted
        r.extend([99])
        assert c.stats().protected_tokens == 8
    conserved(c, 0)
    assert c.stats().protected_tokens == 0
    r = c.admit(list(range(20)))
    del r  # collected unfinished: aborted
    conserved(c, 0)


def test_priority_and_namespaces_reach_the_inserts():
    c = Cache(page_size=2, pool_slots=16, policy="priority")
    hi = c.admit([1, 2, 3, 4], ns="a", priority=9)
    assert hi.priority == 9 and hi.ns == "a"
    hi.finish()
    c.admit([5, 6, 7, 8], priority=0).finish()
    assert c.match_len([1, 2, 3, 4], ns="a") == 4 and c.match_len([1, 2, 3, 4]) == 0
    c.evict(4)  # the low-priority request's pages go first
    assert c.match_len([1, 2, 3, 4], ns="a") == 4 and c.match_len([5, 6, 7, 8]) == 0
    with pytest.raises(radixkv.InvalidArgumentError, match="^Cache.admit: "):
        c.admit([1, 2], priority=1 << 40)


def test_refusals_change_nothing():
    with pytest.raises(radixkv.NoPoolError, match="^Cache.admit: this cache has no slot pool"):
        Cache(page_size=2).admit([1, 2, 3])
    c = Cache(page_size=2, pool_slots=8)
    with pytest.raises(radixkv.OutOfSlotsError, match="^Cache.admit: "):
        c.admit(list(range(10)))  # more than the pool
    conserved(c, 0)
    with pytest.raises(ValueError):
        c.admit([1, -2])
    r = c.admit([1, 2, 3, 4, 5])  # 3 pages
    before = list(r.slots)
    with pytest.raises(radixkv.OutOfSlotsError, match="^Request.extend: "):
        r.extend([6, 7, 8, 9])  # needs 2 more pages, 1 left: refused whole
    assert (len(r), list(r.slots)) == (5, before)
    conserved(c, 6)
    with pytest.raises(ValueError):
        r.extend([2**32])
    assert len(r) == 5
    r.extend([6])  # fits the spare slot
    assert len(r) == 6
    r.finish()
    conserved(c, 0)


def test_closing_the_cache_aborts_its_requests():
    c = Cache(page_size=2, pool_slots=8)
    r = c.admit([1, 2, 3, 4])
    r.checkpoint()
    c.close()
    with pytest.raises(radixkv.CacheClosedError):
        r.extend([5])
    with pytest.raises(radixkv.CacheClosedError):
        r.finish()
    del r  # nothing left to abort, and no error


def test_requests_on_a_host_tier_cache_back_pages_up():
    c = Cache(page_size=2, pool_slots=8, host=dict(host_slots=8, write_policy="write_through"))
    r = c.admit([1, 2, 3, 4])
    r.finish()
    c.wait_all()
    assert c.tier_stats().host_backed_slots == 4
    c.evict(8)
    assert c.lookup([1, 2, 3, 4]).host_len == 4


def test_threads_conserve_slots():
    c = Cache(page_size=4, pool_slots=256)
    errors = []

    def worker(seed):
        try:
            for i in range(200):
                base = (seed * 7 + i) % 5 * 100
                try:
                    r = c.admit(list(range(base, base + 12)))
                except radixkv.OutOfSlotsError:
                    continue
                if i % 3 == 0:
                    r.checkpoint()
                try:
                    r.extend([base + 50 + i % 4])
                except radixkv.OutOfSlotsError:
                    r.abort()
                    continue
                if i % 5 == 0:
                    r.abort()
                else:
                    r.finish()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    conserved(c, 0)
    assert c.stats().protected_tokens == 0
