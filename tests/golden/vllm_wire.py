"""Golden payloads for radixkv's vLLM KV-event wire encodings, made by msgspec.

msgspec is vLLM's encoder. The structs below are vLLM's
(`vllm/distributed/kv_events.py`: EventBatch, KVCacheEvent, BlockStored, BlockRemoved,
AllBlocksCleared) with the field set of docs/contract/KV_EVENTS.md, written twice:

- "vllm-array": `array_like=True, tag=True`, every field present. (vLLM's array-like
  structs also set `omit_defaults=True`, which drops a *trailing* field equal to its
  default, here `kv_cache_spec_sliding_window=None`; the spec asks for every field, and
  every consumer reads the field as absent either way.)
- "vllm-map": `tag=True, omit_defaults=True` (vLLM's current map form): "type" first,
  fields without a default always present, fields equal to their default left out.

The batch is `array_like=True` in both: `[ts, events, data_parallel_rank]`.

Run: python3 -m venv /tmp/msgspec-venv && /tmp/msgspec-venv/bin/pip install msgspec
     /tmp/msgspec-venv/bin/python tests/golden/vllm_wire.py
It prints the Rust constants kept in tests/dynamo-consumer/tests/dynamo/wire.rs (made
with msgspec 0.23.0): the default group's batches, then (GROUP_*) the same events
published by a cache of a sliding-window KV group (group_idx 3, window 4096).
"""

from typing import Any

import msgspec

ExternalBlockHash = int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


# ---- vllm-array -------------------------------------------------------------------
class KVCacheEventA(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class BlockStoredA(KVCacheEventA, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemovedA(KVCacheEventA, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksClearedA(KVCacheEventA, tag="AllBlocksCleared"):
    pass


# ---- vllm-map ---------------------------------------------------------------------
class KVCacheEventM(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStoredM(KVCacheEventM, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemovedM(KVCacheEventM, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksClearedM(KVCacheEventM, tag="AllBlocksCleared"):
    pass


SALT = "dynamo-cache-salt:tenant-a"


def events(stored, removed, cleared, signed, group=(0, "full_attention", None)):
    idx, kind, window = group
    spec = dict(group_idx=idx, kv_cache_spec_kind=kind)
    if window is not None:
        spec["kv_cache_spec_sliding_window"] = window
    if signed:
        h = [-3488128144981237669, 5674439469042975057]
        parent = -1307369107475853156
    else:
        h = [16863443419780771464, 12466389667045779788]
        parent = 2**64 - 1
    return [
        stored(
            block_hashes=h,
            parent_block_hash=None,
            token_ids=list(range(1, 33)),
            block_size=16,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            **spec,
        ),
        stored(
            block_hashes=[1, h[1]],
            parent_block_hash=parent,
            token_ids=[0, 1, 2, 3],
            block_size=2,
            lora_id=None,
            medium="GPU",
            lora_name="adapter-a",
            extra_keys=[(SALT,), None],
            **spec,
        ),
        removed(block_hashes=[5, h[0]], medium="CPU_PINNED", group_idx=idx),
        cleared(),
    ]


enc = msgspec.msgpack.Encoder()
for name, kinds in [
    ("ARRAY", (BlockStoredA, BlockRemovedA, AllBlocksClearedA)),
    ("MAP", (BlockStoredM, BlockRemovedM, AllBlocksClearedM)),
]:
    for signed in (False, True):
        b = EventBatch(ts=1700000000.25, events=events(*kinds, signed), data_parallel_rank=3 if signed else 0)
        tag = name + ("_SIGNED" if signed else "")
        print(f'const {tag}: &str = "{enc.encode(b).hex()}";')
    # A cache publishing a hybrid model's sliding-window group (KvGroup 3, window 4096).
    b = EventBatch(
        ts=1700000000.25,
        events=events(*kinds, False, group=(3, "sliding_window", 4096)),
        data_parallel_rank=0,
    )
    print(f'const GROUP_{name}: &str = "{enc.encode(b).hex()}";')
