"""Test vectors for radixkv's SGLang hash mode, computed by SGLang's own functions.

Run with an interpreter that has SGLang 0.5.23 installed (its page hash is a C++
extension that torch builds on first use, so `ninja` must be on PATH):

    PATH=$VENV/bin:$PATH $VENV/bin/python tests/golden/sglang_hashes.py

It prints the constants that tests/events_hash.rs keeps. Functions used, all from
SGLang 0.5.23:
- sglang.srt.mem_cache.utils.get_hash_str: SHA-256 page chain (prior digest ++ the
  page's tokens as LE u32), one hex digest per page;
- sglang.srt.mem_cache.utils.compute_node_event_hash_values: the event chain of a
  namespaced node (seeded by the cache salt);
- sglang.srt.mem_cache.utils.hash_str_to_int64: first 8 bytes as signed int64;
- sglang.srt.disaggregation.kv_events.kv_event_namespace_seed / namespaced_block_hash:
  the namespace wrap SGLang's KV-event recorder applies in its Dynamo format
  (sglang.srt.mem_cache.events, `_namespace_seed` with dynamo_format=True), with
  extra_key = the LoRA name.
"""

from array import array

from sglang.srt.disaggregation.kv_events import kv_event_namespace_seed, namespaced_block_hash
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import (
    compute_node_event_hash_values,
    get_hash_str,
    hash_str_to_int64,
)


class Node:
    def __init__(self, key, parent):
        self.key = key
        self.parent = parent
        self.hash_value = None
        self.event_hash_value = None


def event_hashes(tokens, page, lora=None, salt=None):
    if lora is None and salt is None:
        hexes = get_hash_str(tokens, None, page_size=page)
    else:
        root = Node(RadixKey(array("I")), None)
        node = Node(RadixKey(array("I", tokens), extra_key=lora, cache_salt=salt), root)
        hexes = compute_node_event_hash_values(node, page)
    seed = kv_event_namespace_seed(extra_key=lora, cache_salt=salt)
    return [namespaced_block_hash(hash_str_to_int64(h), namespace_seed=seed) for h in hexes]


CASES = [
    ("BASE_1_32_P16", list(range(1, 33)), 16, None, None),
    ("BASE_1_12_P4", list(range(1, 13)), 4, None, None),
    ("SALT_1_32_P16", list(range(1, 33)), 16, None, "tenant-a"),
    ("LORA_1_32_P16", list(range(1, 33)), 16, "adapter-a", None),
    ("BOTH_1_32_P16", list(range(1, 33)), 16, "adapter-a", "tenant-a"),
    ("BIG_TOKENS_P2", [0, 4294967295, 7, 100000], 2, None, None),
]

for name, tokens, page, lora, salt in CASES:
    hs = event_hashes(tokens, page, lora, salt)
    print(f"const {name}: [i64; {len(hs)}] = [{', '.join(str(h) for h in hs)}];")
