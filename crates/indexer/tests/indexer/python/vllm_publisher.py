"""An engine's KV-event publisher written from vLLM's wire format, independent of radixkv's
encoder: msgspec structs as vllm/distributed/kv_events.py declares them (EventBatch,
BlockStored, BlockRemoved), a pyzmq PUB socket sending [topic, seq (u64 big-endian),
payload] and a ROUTER replay socket answering [b"", start_seq] with [b"", seq, payload]
frames and the end marker seq 2**64 - 1.

Used by crates/indexer/tests/indexer/python_publisher.rs:
  python vllm_publisher.py --encoding array|map
prints {"endpoint": ..., "replay": ...}, publishes empty batches until a line "go" on stdin,
then its batches
(one of them kept off the PUB socket, only in the replay ring: a gap), prints
{"last_seq": N, "queries": [[token_ids, matched_tokens], ...]} (what each prompt's query must
answer for this worker, from its own bookkeeping), then answers replay until stdin closes.
"""

import argparse
import hashlib
import json
import select
import sys
import time
from typing import Any

import msgspec
import zmq


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEventA(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStoredA(KVCacheEventA, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class BlockRemovedA(KVCacheEventA, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class KVCacheEventM(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStoredM(KVCacheEventM, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class BlockRemovedM(KVCacheEventM, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


def block_hash(parent, tokens):
    h = hashlib.sha256(repr((parent, tokens)).encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--encoding", choices=["array", "map"], default="array")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--salt", type=int, default=0)
    a = ap.parse_args()
    stored_t, removed_t = (
        (BlockStoredA, BlockRemovedA) if a.encoding == "array" else (BlockStoredM, BlockRemovedM)
    )
    bs = a.block_size
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    router = ctx.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:*")
    print(json.dumps({"endpoint": pub.getsockopt_string(zmq.LAST_ENDPOINT),
                      "replay": router.getsockopt_string(zmq.LAST_ENDPOINT)}), flush=True)
    ring = []  # (seq, payload)
    enc = msgspec.msgpack.Encoder()

    def serve():
        while router.poll(0):
            frames = router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue
            start = int.from_bytes(frames[2], "big")
            for s, p in ring:
                if s >= start:
                    router.send_multipart([frames[0], b"", s.to_bytes(8, "big"), p])
            router.send_multipart([frames[0], b"", (2**64 - 1).to_bytes(8, "big"), b""])

    # Empty batches until "go" (the test says it when its SUB socket has joined).
    seq = 0
    while True:
        r, _, _ = select.select([sys.stdin], [], [], 0.02)
        if r and sys.stdin.readline().strip() == "go":
            break
        payload = enc.encode(EventBatch(ts=time.time(), events=[], data_parallel_rank=0))
        ring.append((seq, payload))
        pub.send_multipart([b"kv@python", seq.to_bytes(8, "big"), payload])
        seq += 1
        serve()
    prompts = [
        [(a.salt * 1000 + p) * 100 + i for i in range(bs * a.blocks)] for p in range(a.prompts)
    ]
    hashes = []
    for p in prompts:
        hs, parent = [], None
        for b in range(a.blocks):
            parent = block_hash(parent, p[b * bs:(b + 1) * bs])
            hs.append(parent)
        hashes.append(hs)
    held = [0] * a.prompts  # leading blocks held per prompt
    gap_at = seq + a.prompts // 2
    for p in range(a.prompts):
        events = [stored_t(block_hashes=hashes[p], parent_block_hash=None, token_ids=prompts[p],
                           block_size=bs, lora_id=None, medium="GPU")]
        held[p] = a.blocks
        if p % 3 == 2:
            # Evict the tail of an earlier prompt (its last two blocks).
            q = p - 2
            events.append(removed_t(block_hashes=hashes[q][held[q] - 2:held[q]], medium="GPU"))
            held[q] -= 2
        payload = enc.encode(EventBatch(ts=time.time(), events=events, data_parallel_rank=0))
        ring.append((seq, payload))
        if seq != gap_at:
            pub.send_multipart([b"kv@python", seq.to_bytes(8, "big"), payload])
        seq += 1
        serve()
        time.sleep(0.01)
    queries = [[prompts[p], held[p] * bs] for p in range(a.prompts)]
    print(json.dumps({"last_seq": seq - 1, "queries": queries}), flush=True)
    while True:
        r, _, _ = select.select([sys.stdin], [], [], 0.01)
        if r and not sys.stdin.readline():
            return
        serve()


if __name__ == "__main__":
    main()
