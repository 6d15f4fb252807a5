"""KV events from Python: Cache(..., events=...), set_namespace_meta, flush_events, the
events() iterator of typed events, events_stats, and publish() returning a Publisher."""

import socket
import threading

import pytest

import radixkv
from radixkv import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Cache,
    EventOptions,
    Status,
)

# The spec's vectors (docs/contract/KV_EVENTS.md): tokens 1..16 as one page, seed 1337, and the sequence
# hash of the next page 17..32.
PAGE_1 = 16863443419780771464
PAGE_2 = 12466389667045779788


def fill(c, tokens, ns=0):
    c.insert(tokens, c.alloc(len(tokens)), ns=ns)


def quick(c, **kw):
    kw.setdefault("linger_ms", 0)
    kw.setdefault("auto_flush_ms", 0)
    return c.publish("tcp://127.0.0.1:*", **kw)


def test_events_carry_the_spec_hashes_in_sequence_order():
    with Cache(page_size=16, pool_slots=256, events=True) as c:
        assert c.events_options == EventOptions()
        assert c.flush_events() is None
        assert list(c.events()) == []
        fill(c, list(range(1, 17)))
        assert c.flush_events() == 0
        fill(c, list(range(1, 33)))
        assert c.flush_events() == 1
        ev = list(c.events())
        assert [type(e) for e in ev] == [BlockStored, BlockStored]
        a, b = ev
        assert (a.seq, a.block_hashes, a.parent_block_hash) == (0, [PAGE_1], None)
        assert a.token_ids == list(range(1, 17)) and a.block_size == 16
        assert (a.lora_name, a.cache_salt, a.medium) == (None, None, "GPU")
        assert a.ts > 1.6e9
        assert (b.seq, b.block_hashes, b.parent_block_hash) == (1, [PAGE_2], PAGE_1)
        assert b.token_ids == list(range(17, 33))
        assert list(c.events()) == []

        # Evict everything: the removals (merged: one event), then a re-store.
        c.evict(10**9)
        fill(c, list(range(1, 17)))
        assert c.flush_events() == 2
        ev = list(c.events())
        assert [type(e) for e in ev] == [BlockRemoved, BlockStored]
        assert sorted(ev[0].block_hashes) == sorted([PAGE_1, PAGE_2]) and ev[0].seq == 2
        assert ev[1].block_hashes == [PAGE_1] and ev[1].parent_block_hash is None
        assert c.events_stats() == radixkv.EventStats(batches=3, events=5, dropped=0)  # 2 removals merged


def test_many_batches_drain_in_one_iterator():
    with Cache(page_size=4, pool_slots=4096, events=True) as c:
        for i in range(200):
            fill(c, [1, 2, 3, 4], ns=i + 1)
            assert c.flush_events() == i
        ev = list(c.events())
        assert [e.seq for e in ev] == list(range(200))
        assert ev[-1].cache_salt == "200"  # a namespace never named: its decimal id


def test_options_and_refusals():
    with Cache(page_size=16, pool_slots=64) as plain:
        with pytest.raises(radixkv.InvalidArgumentError, match="Cache.flush_events: events are not enabled"):
            plain.flush_events()
        with pytest.raises(radixkv.InvalidArgumentError, match="events are not enabled"):
            list(plain.events())
        with pytest.raises(radixkv.InvalidArgumentError, match="events are not enabled"):
            plain.publish("tcp://127.0.0.1:*")
        with pytest.raises(radixkv.InvalidArgumentError, match="events are not enabled"):
            plain.set_namespace_meta(1, lora_name="a")
    with pytest.raises(radixkv.InvalidArgumentError, match="hash_mode must be one of"):
        Cache(events=EventOptions(hash_mode="md5"))
    with pytest.raises(radixkv.InvalidArgumentError, match="medium must be one of"):
        Cache(events=EventOptions(medium="TAPE"))
    with pytest.raises(TypeError):
        Cache(events="yes")
    with Cache(events=False) as c:
        assert c.events_options is None
    opts = EventOptions(hash_mode="sglang-sha256", medium="CPU_PINNED", max_drain_batches=1)
    with Cache(page_size=16, pool_slots=64, events=opts) as c:
        fill(c, list(range(1, 17)))
        c.flush_events()
        fill(c, list(range(1, 33)))
        c.flush_events()  # the drain queue holds 1: dropped, counted
        (e,) = list(c.events())
        assert e.medium == "CPU_PINNED" and e.block_hashes != [PAGE_1]
        assert c.events_stats().dropped == 1


def test_namespaces_are_named_before_their_first_insert():
    with Cache(page_size=16, pool_slots=256, events=True) as c:
        c.set_namespace_meta("tenant-a", lora_name="adapter-a", cache_salt="salt-a")
        c.set_namespace_meta(7, cache_salt="salt-7")
        with pytest.raises(radixkv.InvalidArgumentError, match="may not be empty"):
            c.set_namespace_meta(8, lora_name="")
        with pytest.raises(radixkv.InvalidArgumentError, match="NUL"):
            c.set_namespace_meta(8, cache_salt="a\0b")
        with pytest.raises(TypeError):
            c.set_namespace_meta(8, lora_name=b"bytes")
        toks = list(range(1, 17))
        fill(c, toks, ns="tenant-a")
        fill(c, toks, ns=7)
        fill(c, toks)
        with pytest.raises(radixkv.InvalidArgumentError, match="already has hashed pages"):
            c.set_namespace_meta(7, lora_name="late")
        c.flush_events()
        a, b, base = list(c.events())
        assert (a.lora_name, a.cache_salt) == ("adapter-a", "salt-a")
        assert (b.lora_name, b.cache_salt) == (None, "salt-7")
        assert (base.lora_name, base.cache_salt, base.block_hashes) == (None, None, [PAGE_1])
        assert len({a.block_hashes[0], b.block_hashes[0], PAGE_1}) == 3


def test_publish_refuses_bad_endpoints_and_ports_in_use():
    with Cache(page_size=16, pool_slots=64, events=True) as c:
        with pytest.raises(radixkv.InvalidArgumentError, match='"nonsense"'):
            c.publish("nonsense")
        with pytest.raises(radixkv.InvalidArgumentError, match="inproc:// is not supported"):
            c.publish("inproc://x")
        with pytest.raises(radixkv.InvalidArgumentError, match="encoding must be one of"):
            quick(c, encoding="json")
        with pytest.raises(radixkv.InvalidArgumentError, match="Cache.publish: max_queue = 0"):
            quick(c, max_queue=0)
        with pytest.raises(TypeError):
            quick(c, linger_ms=0.5)
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        try:
            with pytest.raises(radixkv.IoError, match="in use") as e:
                c.publish(f"tcp://*:{port}")
            assert e.value.status == Status.IO_ERROR and isinstance(e.value, OSError)
            with pytest.raises(radixkv.IoError, match="in use"):
                quick(c, replay_endpoint=f"tcp://127.0.0.1:{port}")
        finally:
            held.close()
        # Nothing attached: events still drain.
        fill(c, list(range(1, 17)))
        assert c.flush_events() == 0
        assert len(list(c.events())) == 1


def test_a_publisher_publishes_stops_and_outlives_its_cache():
    c = Cache(page_size=16, pool_slots=256, events=True)
    fill(c, list(range(1, 17)))
    assert c.flush_events() == 0  # queued: the publisher sends it first
    with quick(c, replay_endpoint="tcp://127.0.0.1:*", topic="kv@127.0.0.1:0@m", encoding="vllm-map") as p:
        assert p.endpoint.startswith("tcp://127.0.0.1:") and "*" not in p.endpoint
        assert p.replay_endpoint and p.replay_endpoint != p.endpoint
        with pytest.raises(radixkv.InvalidArgumentError, match="a publisher is attached"):
            quick(c)
        fill(c, list(range(1, 33)))
        assert c.flush_events() == 1
        assert list(c.events()) == []  # batches go to the publisher
        final = p.stop()
        assert final.published + final.dropped == 2
        assert p.stop() == final  # stopping again does nothing
    assert p.closed
    with pytest.raises(radixkv.CacheClosedError, match="the publisher is closed"):
        p.stats()
    # Stopped: the cache drains again.
    fill(c, list(range(1, 49)))
    assert c.flush_events() == 2
    assert [e.seq for e in c.events()] == [2]

    # A publisher that outlives its cache: stopping and closing it stays safe.
    p = quick(c)
    fill(c, list(range(1, 65)))
    c.close()
    st = p.stop()
    assert st.published + st.dropped == 1  # the stop flushed the pending store
    p.close()
    p.close()


def test_auto_flush_and_stats_from_threads():
    with Cache(page_size=16, pool_slots=256, events=True) as c:
        with quick(c, auto_flush_ms=5) as p:
            fill(c, list(range(1, 17)))
            stop = threading.Event()
            seen = []

            def read():
                while not stop.is_set():
                    seen.append(p.stats().published)

            t = threading.Thread(target=read)
            t.start()
            for _ in range(500):
                if p.stats().published:
                    break
                threading.Event().wait(0.01)
            stop.set()
            t.join()
            assert p.stats().published == 1
            assert c.flush_events() is None  # the publisher's thread closed it already
            assert seen and all(n in (0, 1) for n in seen)


def test_events_under_concurrent_inserts_hold_every_page_once():
    with Cache(page_size=4, pool_slots=1 << 16, events=True) as c:
        def work(k):
            for i in range(50):
                fill(c, [k, i, 0, 0, k, i, 1, 1], ns=k)
                c.flush_events()

        threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
        drained = []
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            drained.extend(c.events())
        for t in threads:
            t.join()
        c.flush_events()
        drained.extend(c.events())
        seqs = [e.seq for e in drained]
        assert seqs == sorted(seqs) and len(set(seqs)) == c.events_stats().batches
        stored = [h for e in drained if isinstance(e, BlockStored) for h in e.block_hashes]
        assert len(stored) == len(set(stored)) == 4 * 50 * 2
        assert not any(isinstance(e, (BlockRemoved, AllBlocksCleared)) for e in drained)


def test_clear_publishes_all_blocks_cleared_and_empties_the_cache():
    with Cache(page_size=16, pool_slots=256, events=True) as c:
        c.clear()  # an empty cache: nothing to publish
        assert c.flush_events() is None
        fill(c, list(range(1, 33)))
        fill(c, list(range(1, 17)), ns=7)
        c.flush_events()
        assert len(list(c.events())) == 2
        c.clear()
        s = c.stats()
        assert (s.cached_tokens, s.nodes, s.free_slots) == (0, 0, 256)
        assert len(c.match(list(range(1, 17)))) == 0
        assert c.flush_events() is not None
        ev = list(c.events())
        assert [type(e) for e in ev] == [AllBlocksCleared]

        # A lock keeps its page: the other one's removal, no clear event.
        fill(c, list(range(1, 33)))
        c.flush_events()
        list(c.events())
        lock = c.match_lock(list(range(1, 17)))
        c.clear()
        assert (c.stats().cached_tokens, c.stats().protected_tokens) == (16, 16)
        c.flush_events()
        ev = list(c.events())
        assert [type(e) for e in ev] == [BlockRemoved] and ev[0].block_hashes == [PAGE_2]
        lock.release()
        c.clear()
        c.flush_events()
        assert [type(e) for e in c.events()] == [AllBlocksCleared]

    # Caller-managed, no events: the slots leave the cache untracked, and it is empty.
    with Cache() as plain:
        plain.insert([100, 101, 102], [40, 41, 42])
        plain.clear()
        assert plain.stats().cached_tokens == 0
        assert len(plain.match([100, 101, 102])) == 0
        plain.insert([100, 101, 102], [40, 41, 42])  # the slots may be inserted again
        assert plain.stats().cached_tokens == 3

    # A closed cache refuses it, as every call.
    c = Cache(page_size=16, pool_slots=256, events=True)
    c.close()
    with pytest.raises(radixkv.CacheClosedError):
        c.clear()


def test_clear_waits_for_calls_in_flight_and_leaves_no_insert_behind_its_event():
    with Cache(page_size=16, pool_slots=4096, events=True) as c:
        stop = threading.Event()

        def inserter():
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    fill(c, list(range(i * 16, i * 16 + 16)), ns=i % 5)
                except radixkv.OutOfSlotsError:
                    c.evict(10**9)

        t = threading.Thread(target=inserter)
        t.start()
        try:
            for _ in range(20):
                c.clear()
        finally:
            stop.set()
            t.join()
        fill(c, list(range(1, 17)))
        c.clear()
        assert c.stats().cached_tokens == 0
        c.flush_events()
        ev = list(c.events())
        # Whatever interleaved, the last event is the clear that left the cache empty.
        assert ev and type(ev[-1]) is AllBlocksCleared


def test_publish_refuses_a_bad_kv_group_and_leaves_the_cache_alone():
    with Cache(page_size=16, pool_slots=64, events=True) as c:
        with pytest.raises(radixkv.InvalidArgumentError, match="unknown kv_cache_spec_kind \"linear\""):
            quick(c, kv_cache_spec_kind="linear")
        with pytest.raises(radixkv.InvalidArgumentError, match="sliding_window needs its sliding window"):
            quick(c, kv_cache_spec_kind="sliding_window")
        with pytest.raises(radixkv.InvalidArgumentError, match="only goes with"):
            quick(c, sliding_window=128)
        with pytest.raises(radixkv.InvalidArgumentError, match="not mamba"):
            quick(c, kv_cache_spec_kind="mamba", sliding_window=4)
        with pytest.raises(radixkv.InvalidArgumentError, match="0 tokens"):
            quick(c, kv_cache_spec_kind="sliding_window", sliding_window=0)
        with pytest.raises(radixkv.InvalidArgumentError, match="group_idx must be below 2"):
            quick(c, group_idx=1 << 32)
        with pytest.raises(ValueError, match="group_idx must be >= 0"):
            quick(c, group_idx=-1)
        with pytest.raises(TypeError, match="kv_cache_spec_kind must be a str"):
            quick(c, kv_cache_spec_kind=None)
        with pytest.raises(TypeError, match="sliding_window must be an int"):
            quick(c, kv_cache_spec_kind="sliding_window", sliding_window=1.5)
        # Nothing attached: events still drain.
        fill(c, list(range(1, 17)))
        assert c.flush_events() == 0
        assert len(list(c.events())) == 1


def test_a_publisher_sends_its_kv_group_in_every_store_and_removal():
    """Read back through replay and decoded by msgspec (vLLM's decoder), when installed."""
    zmq = pytest.importorskip("zmq")
    msgspec = pytest.importorskip("msgspec")
    with Cache(page_size=16, pool_slots=64, events=True) as c:
        fill(c, list(range(1, 17)))
        c.evict(10**9)
        assert c.flush_events() == 0
        with quick(
            c,
            replay_endpoint="tcp://127.0.0.1:*",
            encoding="vllm-map",
            group_idx=3,
            kv_cache_spec_kind="sliding_window",
            sliding_window=4096,
        ) as p:
            for _ in range(1000):
                if p.stats().published == 1:
                    break
                threading.Event().wait(0.005)
            assert p.stats().published == 1
            ctx = zmq.Context()
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.RCVTIMEO, 5000)
            s.connect(p.replay_endpoint)
            try:
                s.send_multipart([b"", (0).to_bytes(8, "big")])
                _, seq, payload = s.recv_multipart()
                assert int.from_bytes(seq, "big") == 0
            finally:
                s.close(linger=0)
                ctx.term()
    ts, events, rank = msgspec.msgpack.decode(payload)
    stored, removed = events
    assert (stored["type"], stored["group_idx"], stored["kv_cache_spec_kind"]) == ("BlockStored", 3, "sliding_window")
    assert stored["kv_cache_spec_sliding_window"] == 4096 and stored["block_hashes"] == [PAGE_1]
    assert (removed["type"], removed["group_idx"], removed["block_hashes"]) == ("BlockRemoved", 3, [PAGE_1])
