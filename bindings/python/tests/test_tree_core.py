"""The native tree core behind radixkv's SGLang tree core (``NativeTreeCore``,
bindings/python/src/tree_core.rs), without SGLang: SGLang's node contract (a split keeps the
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
