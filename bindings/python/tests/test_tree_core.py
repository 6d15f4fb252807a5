"""The native tree core behind radixkv's SGLang tree core (``NativeTreeCore``,
bindings/python/src/tree_core/), without SGLang: SGLang's node contract (a split keeps the
old id on the suffix), match/insert/lock/evict semantics, duplicate frees from
``prev_prefix_len``, LRU order, and bad input refused with nothing changed."""

from array import array

import pytest

from radixkv._native import ext

NativeTreeCore = ext.NativeTreeCore


def q(xs):
    return array("q", xs)


def ints(buf):
    return list(memoryview(buf).cast("q")) if buf is not None else []


def test_empty_tree_matches_nothing():
    t = NativeTreeCore(1)
    root = t.root_id()
    assert t.match_prefix(0, q([1, 2, 3])) == (0, root, 0, -1)
    assert t.sizes() == (0, 0)
    assert t.check() is None


def test_insert_then_match_and_indices():
    t = NativeTreeCore(1)
    root = t.root_id()
    p, node, dups = t.insert(0, q([1, 2, 3, 4]), q([10, 11, 12, 13]))
    assert (p, dups) == (0, None)
    assert t.sizes() == (4, 0)
    n, last, hit, visited = t.match_prefix(0, q([1, 2, 3, 4, 5]))
    assert (n, last, hit, visited) == (4, node, 4, node)
    assert ints(t.collect_indices(node, root)) == [10, 11, 12, 13]
    assert t.check() is None


def test_match_inside_a_node_splits_it_and_the_suffix_keeps_the_id():
    t = NativeTreeCore(1)
    root = t.root_id()
    _, node, _ = t.insert(0, q([1, 2, 3, 4]), q([10, 11, 12, 13]))
    n, prefix, _, _ = t.match_prefix(0, q([1, 2, 9]))
    assert n == 2 and prefix != node
    assert t.children(root) == [prefix]
    assert t.children(prefix) == [node]
    assert ints(t.value(prefix)) == [10, 11] and ints(t.value(node)) == [12, 13]
    assert ints(t.collect_indices(node, root)) == [10, 11, 12, 13]
    assert t.check() is None


def test_insert_frees_duplicates_past_prev_prefix_len_only():
    t = NativeTreeCore(1)
    t.insert(0, q([1, 2, 3, 4]), q([10, 11, 12, 13]))
    # A request that matched 2 tokens (its first 2 indices are the tree's) and computed the
    # rest again: the tree keeps its own, the request's copies of tokens 3 and 4 are freed.
    p, _, dups = t.insert(0, q([1, 2, 3, 4, 5]), q([10, 11, 22, 23, 24]), 2)
    assert p == 4
    assert ints(dups) == [22, 23]
    assert t.sizes() == (5, 0)
    # prev_prefix_len 0: every overlapping index of the request is a duplicate.
    _, _, dups = t.insert(0, q([1, 2, 3]), q([30, 31, 32]), 0)
    assert ints(dups) == [30, 31, 32]


def test_values_none_uses_the_tokens():
    t = NativeTreeCore(1)
    _, node, _ = t.insert(0, q([7, 8]), None)
    assert ints(t.value(node)) == [7, 8]


def test_namespaces_are_apart():
    t = NativeTreeCore(1)
    t.insert(0, q([1, 2]), q([10, 11]))
    assert t.match_prefix(1, q([1, 2]))[0] == 0
    t.insert(1, q([1, 2]), q([20, 21]))
    root = t.root_id()
    n, node, _, _ = t.match_prefix(1, q([1, 2]))
    assert n == 2 and ints(t.collect_indices(node, root)) == [20, 21]


def test_pages_align_keys_down():
    t = NativeTreeCore(4)
    p, node, _ = t.insert(0, q(list(range(10))), q(list(range(100, 110))))
    assert t.node_info(node)[1] == 8  # two whole pages of the ten tokens
    assert t.match_prefix(0, q(list(range(7))))[0] == 4
    # A divergence inside a page matches up to the page before it.
    assert t.match_prefix(0, q([0, 1, 2, 3, 4, 5, 99, 7]))[0] == 4
    assert t.check() is None


def test_lock_protects_the_path_and_unlock_returns_it():
    t = NativeTreeCore(1)
    _, a, _ = t.insert(0, q([1, 2, 3, 4]), q([10, 11, 12, 13]))
    _, prefix, _, _ = t.match_prefix(0, q([1, 2]))
    assert t.inc_lock_ref(prefix) == 2
    assert t.sizes() == (2, 2)
    assert t.inc_lock_ref(a) == 2  # the prefix was protected already
    assert t.sizes() == (0, 4)
    assert t.dec_lock_ref(a) == 2
    assert t.dec_lock_ref(prefix) == 2
    assert t.sizes() == (4, 0)
    assert t.check() is None


def test_unlock_of_an_unlocked_node_is_refused_and_changes_nothing():
    t = NativeTreeCore(1)
    _, a, _ = t.insert(0, q([1, 2]), q([10, 11]))
    with pytest.raises(ValueError, match="lock_ref 0"):
        t.dec_lock_ref(a)
    assert t.sizes() == (2, 0)
    assert t.node_info(a)[3] == 0
    assert t.check() is None


def test_missing_node_ids_raise_key_error():
    t = NativeTreeCore(1)
    for call in (t.inc_lock_ref, t.dec_lock_ref, t.node_info, t.children, t.is_root):
        with pytest.raises(KeyError):
            call(12345)


def test_short_values_are_refused_and_nothing_is_inserted():
    t = NativeTreeCore(1)
    with pytest.raises(ValueError, match="values has 2 indices for 3"):
        t.insert(0, q([1, 2, 3]), q([10, 11]))
    assert t.sizes() == (0, 0)
    assert t.children(t.root_id()) == []


def test_bad_token_types_are_refused():
    t = NativeTreeCore(1)
    with pytest.raises(TypeError):
        t.match_prefix(0, "abc")
    with pytest.raises(ValueError):
        NativeTreeCore(0)


def _evict(t, n):
    """SGLang's controller walk: start, next/leaf until done, end; the freed indices."""
    t.evict_start(n)
    freed = []
    while True:
        node = t.evict_next(len(freed))
        if node is None:
            break
        freed += ints(t.evict_leaf(node))
    t.evict_end()
    return freed


def test_eviction_takes_the_least_recently_used_leaf_first():
    t = NativeTreeCore(1)
    t.insert(0, q([1, 2]), q([10, 11]))
    t.insert(0, q([3, 4]), q([20, 21]))
    t.match_prefix(0, q([1, 2]))  # [1, 2] is now the newer
    assert _evict(t, 1) == [20, 21]
    assert t.sizes() == (2, 0)
    assert t.check() is None


def test_eviction_walks_up_to_a_parent_that_became_a_leaf():
    t = NativeTreeCore(1)
    t.insert(0, q([1, 2, 3, 4]), q([10, 11, 12, 13]))
    t.match_prefix(0, q([1, 2]))  # split: [1, 2] -> [3, 4]
    freed = _evict(t, 4)
    assert sorted(freed) == [10, 11, 12, 13]
    assert t.sizes() == (0, 0)
    assert t.children(t.root_id()) == []


def test_locked_nodes_are_never_evicted():
    t = NativeTreeCore(1)
    _, a, _ = t.insert(0, q([1, 2]), q([10, 11]))
    t.insert(0, q([3, 4]), q([20, 21]))
    t.inc_lock_ref(a)
    assert _evict(t, 100) == [20, 21]
    assert t.sizes() == (0, 2)
    with pytest.raises(ValueError, match="not an evictable device leaf"):
        t.evict_leaf(a)
    assert t.sizes() == (0, 2)
    assert t.check() is None


def test_evict_next_without_a_walk_is_an_error():
    t = NativeTreeCore(1)
    with pytest.raises(RuntimeError, match="no eviction walk"):
        t.evict_next(0)


def test_reset_drops_everything_and_mints_a_new_root():
    t = NativeTreeCore(1)
    old_root = t.root_id()
    _, a, _ = t.insert(0, q([1, 2]), q([10, 11]))
    t.reset()
    assert t.root_id() != old_root
    assert t.sizes() == (0, 0)
    with pytest.raises(KeyError):
        t.node_info(a)


def test_match_full_device_prefix_is_read_only():
    t = NativeTreeCore(1)
    _, a, _ = t.insert(0, q([1, 2, 3, 4]), q([10, 11, 12, 13]))
    assert t.match_full_device_prefix(0, q([1, 2, 9])) == (2, a, 4)
    assert t.children(t.root_id()) == [a]  # no split


def test_limit_caps_the_key_without_a_copy_of_it():
    t = NativeTreeCore(1)
    toks = q([1, 2, 3, 4, 5])
    p, node, _ = t.insert(0, toks, q([10, 11, 12, 13, 14]), 0, 3)
    assert t.node_info(node)[1] == 3
    assert t.match_prefix(0, toks, 2)[0] == 2
    assert t.match_prefix(0, toks)[0] == 3
    assert t.match_full_device_prefix(0, toks, 1)[0] == 1


def test_strided_and_tensor_like_inputs_read_the_same():
    t = NativeTreeCore(1)
    t.insert(0, [1, 2, 3], [10, 11, 12])  # plain lists are read item by item
    assert t.match_prefix(0, memoryview(q([9, 1, 9, 2, 9, 3]))[1::2])[0] == 3


def test_children_keep_their_order_through_removals():
    t = NativeTreeCore(1)
    root = t.root_id()
    nodes = [t.insert(0, q([k, 100 + k]), q([k, k]))[1] for k in range(1, 21)]
    t.match_prefix(0, q([5, 105]))  # the newest: evicted last
    t.evict_start(30)  # 15 leaves of 2 tokens, the oldest first: 1..4, then 6..16
    freed = 0
    while (n := t.evict_next(freed)) is not None:
        freed += len(t.evict_leaf(n)) // 8
    t.evict_end()
    assert t.children(root) == [nodes[4]] + nodes[16:]
    assert t.node_info(root)[4] == 5
    assert t.check() is None
    _, again, _ = t.insert(0, q([1, 101]), q([1, 1]))
    assert t.children(root) == [nodes[4]] + nodes[16:] + [again]


# ---- the SWA component (swa_window > 0): SGLang's components/swa.py rules ----------------

FREE, FREE_FULL_ONLY, REBUILD, RECOVER_LOCKED = 0, 1, 2, 3


def acts(raw):
    return [(kind, node, ints(a), ints(b) if b is not None else None) for kind, node, a, b in raw]


def swa_tree(window=4):
    """Page 1, window 4: [1..8] -> 10..17, capped into [1..4] + [5..8], SWA values stored
    as the cache does on SWARebuild (SWA index = FULL index + 100), the insert's window
    refresh done. Returns (tree, parent, leaf)."""
    t = NativeTreeCore(1, swa_window=window)
    p, leaf, raw, refreshed = t.insert_swa(0, q(range(1, 9)), q(range(10, 18)))
    assert (p, refreshed) == (0, False)  # SWARebuild is a barrier: the refresh waits
    a = acts(raw)
    parent = t.node_info(leaf)[0]
    # The leaf is capped at one window; the older part is published first.
    assert a == [(REBUILD, parent, [10, 11, 12, 13], None), (REBUILD, leaf, [14, 15, 16, 17], None)]
    for _, node, full, _ in a:
        t.swa_set_value(node, q([x + 100 for x in full]))
    t.swa_refresh(leaf)
    assert t.check() is None
    return t, parent, leaf


def test_swa_window_refresh_orders_the_lru_leaf_first():
    t, parent, leaf = swa_tree()
    assert t.swa_lru() == [leaf, parent]
    assert t.swa_sizes() == (8, 0)
    assert ints(t.swa_value(parent)) == [110, 111, 112, 113]


def test_swa_a_match_is_valid_only_where_the_swa_run_covers_the_window():
    t, parent, leaf = swa_tree()
    root = t.root_id()
    # SWA's walk: the LRU end is the parent, an internal node: it becomes a tombstone and
    # its SWA slots are freed by FULL index.
    t.swa_evict_start(4)
    node, full, state = t.swa_evict_next(0)
    assert (node, ints(full), state) == (parent, [10, 11, 12, 13], None)  # no Mamba: no state
    assert t.swa_evict_next(4) is None  # the request is met
    t.swa_evict_end()
    assert t.swa_info(parent)[0] == -1 and ints(t.value(parent)) == [10, 11, 12, 13]
    assert t.swa_sizes() == (4, 0)
    # The leaf's 4 SWA tokens cover the window: the whole path matches.
    assert t.match_prefix(0, q(range(1, 9)))[:3] == (8, leaf, 8)
    # Ending on the tombstone: FULL holds 4 tokens, no valid match.
    assert t.match_prefix(0, q([1, 2, 3, 4]))[:3] == (0, root, 4)
    # Ending 2 tokens past it (the leaf splits): 2 SWA tokens < the window of 4.
    n, best, hit, _ = t.match_prefix(0, q([1, 2, 3, 4, 5, 6, 99]))
    assert (n, best, hit) == (0, root, 6)
    assert t.check() is None


def test_swa_window_lock_pins_one_window_and_stamps_its_boundary():
    t, parent, leaf = swa_tree()
    uuid = t.swa_inc_lock(leaf)
    assert uuid != 0 and t.swa_info(leaf)[1:3] == (1, uuid)
    assert t.swa_info(parent)[1] == 0  # the leaf alone covers the window
    assert t.swa_sizes() == (4, 4)
    # A wrong stamp would walk past the segment onto unlocked nodes: refused, unchanged.
    with pytest.raises(ValueError, match="no window lock"):
        t.swa_dec_lock(leaf, uuid + 1)
    assert t.swa_sizes() == (4, 4) and t.swa_info(leaf)[1] == 1
    t.swa_dec_lock(leaf, uuid)
    assert t.swa_sizes() == (8, 0)
    with pytest.raises(ValueError, match="no window lock"):
        t.swa_dec_lock(leaf, uuid)
    assert t.check() is None


def test_swa_early_release_evicts_a_leafs_window_and_keeps_its_full_kv():
    t, parent, leaf = swa_tree()
    uuid = t.swa_inc_lock(leaf)  # the window lock only (no FULL lock on the path)
    freed = t.dec_swa_lock_only(leaf, uuid)
    assert ints(freed) == [14, 15, 16, 17]  # a device leaf once unlocked: its SWA goes
    assert t.swa_info(leaf)[0] == -1 and ints(t.value(leaf)) == [14, 15, 16, 17]
    assert t.swa_sizes() == (4, 0) and t.sizes() == (8, 0)
    # With FULL locked too, the leaf stays locked: its window is only made evictable.
    t2, _, leaf2 = swa_tree()
    t2.inc_lock_ref(leaf2)
    u2 = t2.swa_inc_lock(leaf2)
    assert ints(t2.dec_swa_lock_only(leaf2, u2)) == []
    assert t2.swa_sizes() == (8, 0) and t2.swa_info(leaf2)[0] == 4
    assert t.check() is None and t2.check() is None


def test_swa_insert_behind_the_evicted_seqlen_leaves_a_tombstone_and_frees_full_only():
    t = NativeTreeCore(1, swa_window=4)
    _, leaf, raw, _ = t.insert_swa(0, q(range(1, 9)), q(range(10, 18)), swa_start=4)
    prefix = t.node_info(leaf)[0]
    assert acts(raw) == [(REBUILD, leaf, [14, 15, 16, 17], None)]
    assert t.node_info(prefix)[1] == 4 and t.swa_info(prefix)[0] == -1
    # The same tokens again, computed anew (prev_prefix_len 0), SWA freed behind 4: the
    # request's copies are duplicates; below its evicted seqlen only FULL is still its own.
    t2, parent, leaf2 = swa_tree()
    _, _, raw, refreshed = t2.insert_swa(0, q(range(1, 9)), q(range(20, 28)), swa_start=4)
    assert refreshed
    assert acts(raw) == [(FREE_FULL_ONLY, -1, [20, 21, 22, 23], None), (FREE, -1, [24, 25, 26, 27], None)]
    assert t.check() is None and t2.check() is None


def test_swa_insert_over_a_tombstone_in_the_window_recovers_it():
    t, parent, leaf = swa_tree()
    t.swa_evict_start(4)
    t.swa_evict_next(0)  # the parent becomes a tombstone
    t.swa_evict_end()
    _, _, raw, _ = t.insert_swa(0, q(range(1, 9)), q(range(20, 28)))
    # The tombstone takes the request's KV: its old FULL slots are freed FULL-only, its
    # window rebuilt from the new ones; the leaf's copies are plain duplicates.
    assert acts(raw) == [
        (FREE_FULL_ONLY, -1, [10, 11, 12, 13], None),
        (REBUILD, parent, [20, 21, 22, 23], None),
        (FREE, -1, [24, 25, 26, 27], None),
    ]
    assert ints(t.value(parent)) == [20, 21, 22, 23]
    # Locked FULL: kept, the cache remaps the incoming SWA onto it.
    t2, parent2, leaf2 = swa_tree()
    t2.swa_evict_start(4)
    t2.swa_evict_next(0)
    t2.swa_evict_end()
    t2.inc_lock_ref(leaf2)
    _, _, raw, _ = t2.insert_swa(0, q(range(1, 9)), q(range(20, 28)))
    assert acts(raw)[0] == (RECOVER_LOCKED, parent2, [10, 11, 12, 13], [20, 21, 22, 23])
    assert ints(t2.value(parent2)) == [10, 11, 12, 13]
    assert t.check() is None and t2.check() is None


def test_swa_evicting_a_leaf_frees_its_window_too():
    t, parent, leaf = swa_tree()
    t.evict_start(8)
    assert t.evict_next(0) == leaf
    assert ints(t.evict_leaf(leaf)) == [14, 15, 16, 17]
    assert t.swa_sizes() == (4, 0) and t.swa_lru() == [parent]
    assert t.check() is None


def test_swa_bad_input_is_refused_with_nothing_changed():
    t, parent, leaf = swa_tree()
    before = (t.dfs(), t.swa_sizes(), t.sizes(), t.swa_lru())
    with pytest.raises(ValueError, match="already has an SWA value"):
        t.swa_set_value(leaf, q([1, 2, 3, 4]))
    with pytest.raises(
        ValueError, match=r"is not a multiple of the page size \(4\); nothing was inserted$"
    ):
        NativeTreeCore(4, swa_window=4).insert_swa(0, q(range(8)), q(range(8)), swa_start=2)
    with pytest.raises(ValueError, match="nothing was inserted"):
        t.insert_swa(0, q(range(1, 20)), q([1, 2]))
    with pytest.raises(KeyError):
        t.swa_inc_lock(10**9)
    with pytest.raises(RuntimeError, match="no SWA walk"):
        t.swa_evict_next(0)
    assert (t.dfs(), t.swa_sizes(), t.sizes(), t.swa_lru()) == before
    t.swa_evict_start(4)
    assert t.swa_evict_next(0)[0] == parent  # the parent becomes a tombstone
    t.swa_evict_end()
    before = (t.swa_sizes(), t.swa_lru())
    with pytest.raises(ValueError, match="has 4 tokens, the SWA value 3"):
        t.swa_set_value(parent, q([1, 2, 3]))
    with pytest.raises(ValueError, match="is the root"):
        t.swa_set_value(t.root_id(), q([]))
    assert (t.swa_sizes(), t.swa_lru()) == before and t.swa_info(parent)[0] == -1
    t.swa_set_value(parent, q([1, 2, 3, 4]))  # the right length: taken, most recent
    assert t.swa_lru()[0] == parent
    assert t.check() is None
    plain = NativeTreeCore(1)
    with pytest.raises(ValueError, match="no SWA component"):
        plain.insert_swa(0, q([1]), q([1]))
    with pytest.raises(ValueError, match="no SWA component"):
        plain.swa_inc_lock(plain.root_id())


def test_swa_tombstone_ranges_and_attaching_a_window_onto_them():
    t, parent, leaf = swa_tree()
    t.swa_evict_start(4)
    t.swa_evict_next(0)  # the parent [1..4] becomes a tombstone
    t.swa_evict_end()
    key = q(range(1, 9))
    assert t.swa_tombstone_ranges(0, key, 0, 8) == [(0, 4)]
    assert t.swa_tombstone_ranges(0, key, 2, 8) == [(2, 4)]
    assert t.swa_tombstone_ranges(0, key, 4, 8) == []
    before = (t.dfs(), t.swa_sizes(), t.swa_lru())
    with pytest.raises(ValueError, match="live SWA"):
        t.attach_swa_window(0, key, 2, 6, q([1, 2, 3, 4]))
    with pytest.raises(ValueError, match="1 SWA values"):
        t.attach_swa_window(0, key, 1, 3, q([1]))
    with pytest.raises(ValueError, match="only to"):
        t.attach_swa_window(0, q([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), 8, 10, q([1, 2]))
    assert (t.dfs(), t.swa_sizes(), t.swa_lru()) == before
    # [1, 3) of the tombstone: it splits at both edges, the middle takes the values.
    t.attach_swa_window(0, key, 1, 3, q([201, 202]))
    assert t.swa_tombstone_ranges(0, key, 0, 8) == [(0, 1), (3, 4)]
    mid = t.swa_lru()[0]
    assert ints(t.swa_value(mid)) == [201, 202] and ints(t.key(mid)) == [2, 3]
    assert t.swa_sizes() == (6, 0)
    assert t.check() is None


# ---- Mamba (SGLang's components/mamba.py) -------------------------------------------------


def mamba_tree():
    """[FULL, MAMBA], page 1: [1..4] -> state 100, then [1..6] -> state 101 (a chain: the
    first request's node is internal, holding its state)."""
    t = NativeTreeCore(1, mamba=True)
    _, a, _ = t.insert(0, q([1, 2, 3, 4]), q([10, 11, 12, 13]))
    assert t.mamba_commit(a, True, q([100])) is False
    p, b, dups = t.insert(0, q([1, 2, 3, 4, 5, 6]), q([10, 11, 12, 13, 14, 15]), 4)
    assert (p, dups) == (4, None)
    assert t.mamba_commit(b, True, q([101])) is False
    return t, a, b


def test_mamba_states_sit_where_sequences_end_and_a_match_ends_on_one():
    t, a, b = mamba_tree()
    assert t.has_mamba() and not NativeTreeCore(1).has_mamba()
    assert t.mamba_sizes() == (2, 0)
    assert t.mamba_lru() == [b, a]  # most recent first
    # A match inside b splits it: the prefix has no state, so the match ends on a.
    n, best, hit, visited = t.match_prefix(0, q([1, 2, 3, 4, 5, 9]))
    assert (n, best, hit) == (4, a, 5) and visited not in (a, b)
    assert t.children(a) == [visited] and t.children(visited) == [b]
    assert t.mamba_info(visited) == (-1, 0, False)  # the split left the state on the suffix
    assert ints(t.mamba_value(b)) == [101]
    assert t.mamba_lru() == [a, b]  # the match refreshed the state it handed out, only it
    assert t.check() is None


def test_mamba_commit_on_an_existing_node_keeps_its_state():
    t, a, b = mamba_tree()
    p, node, dups = t.insert(0, q([1, 2, 3, 4]), q([20, 21, 22, 23]))
    assert (p, node, ints(dups)) == (4, a, [20, 21, 22, 23])
    assert t.mamba_commit(a, False, q([102])) is True  # mamba_exist: the request keeps 102
    assert ints(t.mamba_value(a)) == [100] and t.mamba_sizes() == (2, 0)
    assert t.mamba_lru() == [a, b]
    assert t.check() is None


def test_mamba_lock_is_on_the_node_alone():
    t, a, b = mamba_tree()
    t.inc_lock_ref(b)
    t.mamba_inc_lock(b)
    assert t.mamba_sizes() == (1, 1) and t.mamba_info(a)[1] == 0 and t.mamba_info(b)[1] == 1
    t.mamba_dec_lock(b)
    t.dec_lock_ref(b)
    assert t.mamba_sizes() == (2, 0)
    assert t.check() is None


def test_mamba_walk_makes_internal_tombstones_and_hands_leaves_over():
    t, a, b = mamba_tree()
    t.match_prefix(0, q([1, 2, 3, 4, 5, 6]))  # b the most recent: a at the LRU end
    t.mamba_evict_start(2)
    node, state = t.mamba_evict_next(0)
    assert (node, ints(state)) == (a, [100])  # a has a child: a Mamba tombstone
    assert t.mamba_info(a) == (-1, 0, False) and ints(t.value(a)) == [10, 11, 12, 13]
    assert t.mamba_evict_next(1) == (b, None)  # a device leaf: the controller evicts it
    assert t.mamba_evict_next(1) is None  # the LRU is walked
    t.mamba_evict_end()
    # A match no longer ends on a (no state there): nothing reusable.
    assert t.match_prefix(0, q([1, 2, 3, 4]))[0] == 0
    assert t.mamba_sizes() == (1, 0)
    assert t.check() is None


def test_mamba_walk_skips_locked_states_and_leaves_are_pinned_by_a_mamba_lock():
    t, a, b = mamba_tree()
    t.mamba_inc_lock(b)
    t.mamba_evict_start(5)
    assert t.mamba_evict_next(0)[0] == a
    assert t.mamba_evict_next(1) is None  # b is locked
    t.mamba_evict_end()
    t.evict_start(6)
    assert t.evict_next(0) is None  # the Mamba lock keeps b off the FULL leaves too
    t.evict_end()
    t.mamba_dec_lock(b)
    assert t.check() is None


def test_mamba_path_cap_tombstones_the_shallowest_single_child_states():
    t, a, b = mamba_tree()
    _, c, _ = t.insert(0, q([1, 2, 3, 4, 5, 6, 7]), q([10, 11, 12, 13, 14, 15, 16]), 6)
    t.mamba_commit(c, True, q([103]))
    assert [ints(s) for s in t.mamba_evict_excess(c, 2)] == [[100]]
    assert t.mamba_info(a)[0] == -1 and ints(t.mamba_value(b)) == [101]
    assert t.mamba_evict_excess(c, 1) != []  # b next; never the tail
    assert ints(t.mamba_value(c)) == [103]
    assert t.check() is None


def test_mamba_path_cap_spares_forks_and_locked_states():
    t, a, b = mamba_tree()
    _, c, _ = t.insert(0, q([1, 2, 3, 4, 5, 6, 7]), q([10, 11, 12, 13, 14, 15, 16]), 6)
    t.mamba_commit(c, True, q([103]))
    _, d, _ = t.insert(0, q([1, 2, 3, 4, 9]), q([10, 11, 12, 13, 17]), 4)  # a fork at a
    t.mamba_commit(d, True, q([104]))
    t.mamba_inc_lock(b)
    assert t.mamba_evict_excess(c, 1) == []  # a has two children, b is locked, c the tail
    t.mamba_dec_lock(b)
    assert [ints(s) for s in t.mamba_evict_excess(c, 1)] == [[101]]
    assert ints(t.mamba_value(a)) == [100] and ints(t.mamba_value(c)) == [103]
    assert t.check() is None


def _swa_insert(t, toks, vals, prev=0):
    """An SWA insert as the cache runs it: the rebuilt SWA values stored, then the refresh."""
    _, node, raw, refreshed = t.insert_swa(0, q(toks), q(vals), prev)
    for kind, nid, a, _ in raw:
        if kind == 2:  # SWARebuild: the SWA slots, here numbered as the FULL ones
            t.swa_set_value(nid, q(ints(a)))
    if not refreshed:
        t.swa_refresh(node)
    return node


def test_mamba_state_goes_with_an_swa_tombstone():
    t = NativeTreeCore(1, swa_window=2, mamba=True)
    a = _swa_insert(t, [1, 2, 3, 4], [10, 11, 12, 13])  # the leaf capped at the window: [3, 4]
    t.mamba_commit(a, True, q([100]))
    b = _swa_insert(t, [1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15], 4)
    t.mamba_commit(b, True, q([101]))
    (prefix,) = t.children(t.root_id())
    t.swa_evict_start(4)
    assert t.swa_evict_next(0) == (prefix, bytearray(q([10, 11])), None)  # no state there
    node, full, state = t.swa_evict_next(2)
    assert (node, ints(full), ints(state)) == (a, [12, 13], [100])  # the state goes too
    t.swa_evict_end()
    assert t.mamba_sizes() == (1, 0) and t.mamba_info(a)[0] == -1 and ints(t.mamba_value(b)) == [101]
    assert t.check() is None


def test_mamba_evicting_a_leaf_takes_its_state():
    t, a, b = mamba_tree()
    assert ints(t.evict_leaf(b)) == [14, 15]
    assert t.mamba_sizes() == (1, 0) and t.mamba_lru() == [a]
    assert t.check() is None


def test_mamba_bad_input_is_refused_with_nothing_changed():
    t, a, b = mamba_tree()
    root = t.root_id()
    before = (t.mamba_sizes(), t.mamba_lru(), t.dfs())
    with pytest.raises(ValueError, match="root"):
        t.mamba_commit(root, False, q([7]))
    with pytest.raises(ValueError, match="empty"):
        t.mamba_commit(a, False, q([]))
    with pytest.raises(ValueError, match="not a new leaf"):
        t.mamba_commit(a, True, q([7]))
    with pytest.raises(ValueError, match="already has a Mamba state"):
        t.mamba_set_value(a, q([7]))
    with pytest.raises(ValueError, match="Mamba lock_ref 0"):
        t.mamba_dec_lock(a)
    with pytest.raises(ValueError, match="at least 1"):
        t.mamba_evict_excess(b, 0)
    with pytest.raises(RuntimeError, match="no Mamba walk"):
        t.mamba_evict_next(0)
    with pytest.raises(KeyError):
        t.mamba_inc_lock(999_999)
    with pytest.raises(TypeError):
        t.mamba_commit(a, False, "abc")
    assert (t.mamba_sizes(), t.mamba_lru(), t.dfs()) == before
    assert ints(t.mamba_value(a)) == [100]
    # A tree without Mamba refuses every Mamba call.
    plain = NativeTreeCore(1)
    _, n, _ = plain.insert(0, q([1, 2]), q([1, 2]))
    for call in (
        lambda: plain.mamba_commit(n, True, q([1])),
        lambda: plain.mamba_set_value(n, q([1])),
        lambda: plain.mamba_inc_lock(n),
        lambda: plain.mamba_evict_start(1),
        lambda: plain.mamba_evict_excess(n, 1),
    ):
        with pytest.raises(ValueError, match="no Mamba component"):
            call()
    assert plain.mamba_sizes() == (0, 0) and plain.check() is None


def test_whole_walk_evict_hands_every_pool_its_indices():
    # The core's per-component eviction (HybridTree::evict) through Python: a FULL walk
    # frees leaves whole (their SWA slots and Mamba states with them), an SWA walk makes
    # tombstones of internal nodes, and nothing is freed twice or lost.
    t = NativeTreeCore(1, swa_window=2, mamba=True)
    for k, key in enumerate([range(6), list(range(3)) + [50, 51, 52]]):
        vals = [100 * (k + 1) + i for i in range(6)]
        _, node, acts, refreshed = t.insert_swa(0, q(key), q(vals))
        for kind, n, a, _b in acts:
            if kind == 2:  # SWARebuild: the SWA values are the FULL ones here
                t.swa_set_value(n, q(ints(a)))
        if not refreshed:
            t.swa_refresh(node)
        assert t.mamba_commit(node, True, q([900 + k])) is False
    assert t.check() is None
    with pytest.raises(ValueError, match="not one of"):
        t.evict("tlru", 1)
    with pytest.raises(ValueError, match="no Mamba"):
        NativeTreeCore(1).evict("mamba", 1)
    evicted, freed = t.evict("full", 3)
    assert evicted >= 3
    kinds = [c for c, _ in freed]
    assert "full" in kinds and "mamba" in kinds and "swa" in kinds
    full = [x for c, b in freed if c == "full" for x in ints(b)]
    assert sum(len(ints(b)) for c, b in freed if c == "full") == evicted
    assert len(full) == len(set(full))
    assert t.check() is None
    # Everything left is still the tree's: a second walk takes the rest, never a freed one.
    evicted2, freed2 = t.evict("full", 1 << 20)
    full2 = [x for c, b in freed2 if c == "full" for x in ints(b)]
    assert not set(full) & set(full2)
    assert t.sizes() == (0, 0) and t.mamba_sizes() == (0, 0) and t.swa_sizes() == (0, 0)
    assert t.check() is None
