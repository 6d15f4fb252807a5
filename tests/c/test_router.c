/*
 * The router index's C ABI (ROUTER.md, "Interfaces"): rkv_router_* exercised from C.
 * The happy path (typed stores for two workers, finds by tokens and by content hashes,
 * removal, clear, remove_worker, stats, a vLLM msgpack batch with its seq, dump -> restore
 * giving equal finds) and bad inputs (NULLs, reserved fields, bad options, bad media, invalid
 * UTF-8, malformed payloads refused whole, a sequence gap under RKV_GAP_REFUSE, buffers too
 * small, unknown workers); rkv_router_stats_get_ex counting a sliding-window group's batch in
 * other_groups, and its refusals. Prints "N passed, M failed"; exits non-zero on any failure.
 */
#include "radixkv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#define ST(call, want) CHECK_ST(call, want)

/* The last error message contains `needle`. */
#define MSG(needle) CHECK_LAST_ERROR(needle)

#define BS 4u
#define SENTINEL_LEN ((size_t)0xA5A5A5A5u)

/* One vLLM KV-event batch (msgpack, vLLM's array encoding), as a worker publishes it:
 * [ts 1.0, [["BlockStored", block_hashes [0xA0, 0xA1], parent_block_hash nil,
 * token_ids [1, 2, 3, 4, 5, 6, 7, 8], block_size 4, lora_id nil, medium "GPU", lora_name nil,
 * extra_keys nil, group_idx 0, kv_cache_spec_kind "full_attention", nil]],
 * data_parallel_rank 0]. The Rust unit test `the_c_tests_payload_is_this_batch`
 * (crates/ffi/src/router/tests.rs) checks these bytes are radixkv's encoding of that batch. */
static const uint8_t BATCH[65] = {
    0x93, 0xcb, 0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x91, 0x9c, 0xab, 0x42, 0x6c,
    0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x92, 0xcc, 0xa0, 0xcc, 0xa1, 0xc0,
    0x98, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x04, 0xc0, 0xa3, 0x47, 0x50, 0x55,
    0xc0, 0xc0, 0x00, 0xae, 0x66, 0x75, 0x6c, 0x6c, 0x5f, 0x61, 0x74, 0x74, 0x65, 0x6e, 0x74,
    0x69, 0x6f, 0x6e, 0xc0, 0x00,
};

/* BATCH's store published by a sliding-window group (group_idx 1, kv_cache_spec_kind
 * "sliding_window", window 4) with engine hashes 0xB0, 0xB1: the router skips it (Dynamo's
 * rule) and counts it in rkv_router_stats_ex.other_groups. Pinned to radixkv's encoding by
 * `the_c_tests_sliding_window_payload_is_this_batch` (crates/ffi/src/router/tests/groups.rs). */
static const uint8_t BATCH_SW[65] = {
    0x93, 0xcb, 0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x91, 0x9c, 0xab, 0x42, 0x6c,
    0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x92, 0xcc, 0xb0, 0xcc, 0xb1, 0xc0,
    0x98, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x04, 0xc0, 0xa3, 0x47, 0x50, 0x55,
    0xc0, 0xc0, 0x01, 0xae, 0x73, 0x6c, 0x69, 0x64, 0x69, 0x6e, 0x67, 0x5f, 0x77, 0x69, 0x6e,
    0x64, 0x6f, 0x77, 0x04, 0x00,
};

static rkv_worker worker(uint64_t id, uint32_t rank) {
  rkv_worker w;
  w.worker_id = id;
  w.dp_rank = rank;
  w.reserved = 0;
  return w;
}

static rkv_router *make(uint32_t gap_policy) {
  rkv_router_options o = rkv_router_options_default();
  rkv_router *r = NULL;
  o.block_size = BS;
  o.gap_policy = gap_policy;
  ST(rkv_router_new(&o, &r), RKV_OK);
  CHECK(r != NULL);
  return r;
}

/* Tokens of blocks first..first+n-1: block i is {10i, 10i+1, 10i+2, 10i+3}. */
static void toks(uint32_t first, uint32_t n, uint32_t *out) {
  uint32_t b, j;
  for (b = 0; b < n; b++)
    for (j = 0; j < BS; j++) out[b * BS + j] = (first + b) * 10 + j;
}

static int by_worker(const void *a, const void *b) {
  const rkv_router_score *x = (const rkv_router_score *)a, *y = (const rkv_router_score *)b;
  if (x->worker.worker_id != y->worker.worker_id)
    return x->worker.worker_id < y->worker.worker_id ? -1 : 1;
  return x->worker.dp_rank < y->worker.dp_rank ? -1 : x->worker.dp_rank > y->worker.dp_rank;
}

/* The scores of tokens[0..n) sorted by worker, into out[0..8); their number. */
static size_t find(const rkv_router *r, const uint32_t *tokens, size_t n, rkv_router_score *out) {
  size_t len = SENTINEL_LEN;
  ST(rkv_router_find(r, tokens, n, NULL, NULL, out, 8, &len), RKV_OK);
  if (len > 8) return 0;
  qsort(out, len, sizeof *out, by_worker);
  return len;
}

static int is(const rkv_router_score *s, uint64_t id, uint32_t dev, uint32_t any) {
  return s->worker.worker_id == id && s->worker.dp_rank == 0 && s->worker.reserved == 0 &&
         s->device_blocks == dev && s->any_blocks == any;
}

static rkv_router_stats stats(const rkv_router *r) {
  rkv_router_stats s;
  memset(&s, 0, sizeof s);
  ST(rkv_router_stats_get(r, &s), RKV_OK);
  return s;
}

static void test_options(void) {
  rkv_router_options d = rkv_router_options_default(), o;
  rkv_router *r = (rkv_router *)0x10;
  CHECK(d.block_size == 16 && d.max_workers == 4096 && d.gap_policy == RKV_GAP_CLEAR &&
        d.reserved == 0);
  ST(rkv_router_new(NULL, &r), RKV_NULL_ARGUMENT);
  MSG("rkv_router_new: opts is NULL");
  ST(rkv_router_new(&d, NULL), RKV_NULL_ARGUMENT);
  o = d;
  o.reserved = 1;
  ST(rkv_router_new(&o, &r), RKV_INVALID_ARGUMENT);
  MSG("opts->reserved = 1 must be 0");
  o = d;
  o.gap_policy = 2;
  ST(rkv_router_new(&o, &r), RKV_INVALID_ARGUMENT);
  MSG("gap_policy = 2");
  o = d;
  o.block_size = 0;
  ST(rkv_router_new(&o, &r), RKV_INVALID_ARGUMENT);
  o = d;
  o.max_workers = 0;
  ST(rkv_router_new(&o, &r), RKV_INVALID_ARGUMENT);
  MSG("max_workers = 0");
  CHECK(r == (rkv_router *)0x10); /* nothing written */
  rkv_router_free(NULL);
  CHECK(strncmp(rkv_status_str(RKV_SEQUENCE_GAP), "RKV_SEQUENCE_GAP", 16) == 0);
  CHECK(strncmp(rkv_status_str(RKV_NOT_FOUND), "RKV_NOT_FOUND", 13) == 0);
  CHECK(RKV_SEQUENCE_GAP == 11 && RKV_NOT_FOUND == 12);
}

static void test_happy_path(void) {
  rkv_router *r = make(RKV_GAP_CLEAR), *back = NULL;
  rkv_router_score out[8], out2[8];
  rkv_router_stats s;
  rkv_worker a = worker(1, 0), b = worker(2, 0);
  uint32_t q[4 * BS], t[3 * BS];
  uint64_t ha[3] = {100, 101, 102}, hb[2] = {7, 8}, parent = 7, h8 = 8, h101 = 101;
  uint64_t content[1], seq = 0;
  size_t n, len, i, qn;
  uint8_t *bytes;
  rkv_router_options o = rkv_router_options_default();
  o.block_size = BS;

  toks(0, 4, q);
  qn = sizeof q / sizeof q[0];
  toks(0, 3, t);
  /* Worker 1 holds blocks 0..2, worker 2 blocks 0..1 (its own engine hashes). */
  ST(rkv_router_stored(r, a, NULL, NULL, NULL, ha, 3, t, RKV_MEDIUM_GPU), RKV_OK);
  ST(rkv_router_stored(r, b, NULL, NULL, NULL, hb, 2, t, RKV_MEDIUM_GPU), RKV_OK);
  CHECK(strcmp(rkv_last_error_message(), "") == 0);
  n = find(r, q, qn, out);
  CHECK(n == 2 && is(&out[0], 1, 3, 3) && is(&out[1], 2, 2, 2));
  /* Block 1 of worker 2 also as a host copy, then its device copy removed. */
  ST(rkv_router_stored(r, b, NULL, NULL, &parent, &h8, 1, t + BS, RKV_MEDIUM_CPU_PINNED), RKV_OK);
  ST(rkv_router_removed(r, b, &h8, 1, RKV_MEDIUM_GPU), RKV_OK);
  n = find(r, q, qn, out);
  CHECK(n == 2 && is(&out[0], 1, 3, 3) && is(&out[1], 2, 1, 2));
  s = stats(r);
  CHECK(s.workers == 2 && s.blocks == 3 && s.memberships == 5 && s.refused == 0 && s.bytes > 0);

  /* A batch from worker 3 (dp rank 0 in the payload), seq 40: tokens 1..8. */
  ST(rkv_router_apply_batch(r, 3, 40, BATCH, sizeof BATCH), RKV_OK);
  ST(rkv_router_next_seq(r, worker(3, 0), &seq), RKV_OK);
  CHECK(seq == 41);
  {
    uint32_t bt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    len = SENTINEL_LEN;
    ST(rkv_router_find(r, bt, 8, NULL, NULL, out, 8, &len), RKV_OK);
    CHECK(len == 1 && is(&out[0], 3, 2, 2));
  }
  s = stats(r);
  CHECK(s.batches == 1 && s.workers == 3);

  /* Dump -> restore: the same finds, cursors and counts. */
  len = SENTINEL_LEN;
  ST(rkv_router_dump(r, NULL, 0, &len), RKV_BUFFER_TOO_SMALL);
  CHECK(len > 24 && len != SENTINEL_LEN);
  bytes = (uint8_t *)malloc(len);
  n = len;
  ST(rkv_router_dump(r, bytes, n, &len), RKV_OK);
  CHECK(len == n && memcmp(bytes, "RKVRDUMP", 8) == 0);
  ST(rkv_router_restore(&o, bytes, len, &back), RKV_OK);
  n = find(r, q, qn, out);
  CHECK(find(back, q, qn, out2) == n);
  for (i = 0; i < n; i++) CHECK(memcmp(&out[i], &out2[i], sizeof out[i]) == 0);
  seq = 0;
  ST(rkv_router_next_seq(back, worker(3, 0), &seq), RKV_OK);
  CHECK(seq == 41);
  CHECK(stats(back).blocks == stats(r).blocks && stats(back).memberships == stats(r).memberships);
  rkv_router_free(back);
  free(bytes);

  /* find_hashes: content hashes nobody holds give no scores (the Rust tests check the
   * index's own content hashes; C has no XXH3 at hand). */
  content[0] = 1;
  len = SENTINEL_LEN;
  ST(rkv_router_find_hashes(r, content, 1, out, 8, &len), RKV_OK);
  CHECK(len == 0);

  /* A hole stops worker 1 there; cleared empties worker 2; remove_worker forgets them. */
  ST(rkv_router_removed(r, a, &h101, 1, RKV_MEDIUM_GPU), RKV_OK);
  n = find(r, q, qn, out);
  CHECK(n == 2 && is(&out[0], 1, 1, 1) && is(&out[1], 2, 1, 2));
  ST(rkv_router_cleared(r, b), RKV_OK);
  n = find(r, q, qn, out);
  CHECK(n == 1 && is(&out[0], 1, 1, 1));
  CHECK(stats(r).workers == 3);
  ST(rkv_router_remove_worker(r, a), RKV_OK);
  ST(rkv_router_remove_worker(r, b), RKV_OK);
  ST(rkv_router_remove_worker(r, worker(3, 0)), RKV_OK);
  CHECK(find(r, q, qn, out) == 0);
  s = stats(r);
  CHECK(s.workers == 0 && s.blocks == 0 && s.memberships == 0);
  rkv_router_free(r);
}

static void test_bad_inputs(void) {
  rkv_router *r = make(RKV_GAP_CLEAR);
  rkv_router_score out[2], keep;
  rkv_worker w = worker(1, 0), bad_w = worker(1, 0);
  uint32_t t[2 * BS];
  uint64_t h[2] = {1, 2}, unknown = 42, seq = 77;
  const char bad_utf8[3] = {'a', (char)0xff, 0};
  const uint8_t garbage[4] = {0xc1, 0x00, 0x01, 0x02};
  size_t len;
  rkv_router_stats s0, s1;

  toks(0, 2, t);
  bad_w.reserved = 9;
  ST(rkv_router_stored(NULL, w, NULL, NULL, NULL, h, 2, t, 0), RKV_NULL_ARGUMENT);
  MSG("rkv_router_stored: r is NULL");
  ST(rkv_router_stored(r, bad_w, NULL, NULL, NULL, h, 2, t, 0), RKV_INVALID_ARGUMENT);
  MSG("w.reserved = 9 must be 0");
  ST(rkv_router_stored(r, w, NULL, NULL, NULL, h, 2, t, 5), RKV_INVALID_ARGUMENT);
  MSG("medium = 5");
  ST(rkv_router_stored(r, w, bad_utf8, NULL, NULL, h, 2, t, 0), RKV_INVALID_ARGUMENT);
  MSG("lora_name is not valid UTF-8");
  ST(rkv_router_stored(r, w, NULL, NULL, NULL, NULL, 2, t, 0), RKV_NULL_ARGUMENT);
  ST(rkv_router_stored(r, w, NULL, NULL, NULL, h, 2, NULL, 0), RKV_NULL_ARGUMENT);
  MSG("token_ids is NULL but n * block_size = 8");
  ST(rkv_router_stored(r, w, NULL, NULL, NULL, NULL, 0, NULL, 0), RKV_INVALID_ARGUMENT);
  MSG("no blocks");
  ST(rkv_router_stored(r, w, NULL, NULL, &unknown, h, 2, t, 0), RKV_INVALID_ARGUMENT);
  MSG("parent 0x2a");
  ST(rkv_router_removed(r, worker(5, 0), h, 2, 0), RKV_INVALID_ARGUMENT);
  MSG("2 removed hashes were not held");
  ST(rkv_router_removed(r, w, h, 2, 9), RKV_INVALID_ARGUMENT);
  ST(rkv_router_remove_worker(r, worker(5, 0)), RKV_NOT_FOUND);
  MSG("worker 5/0 is not known");
  ST(rkv_router_cleared(r, bad_w), RKV_INVALID_ARGUMENT);
  ST(rkv_router_next_seq(r, worker(5, 0), &seq), RKV_NOT_FOUND);
  MSG("has no batch cursor");
  ST(rkv_router_next_seq(r, w, NULL), RKV_NULL_ARGUMENT);
  CHECK(seq == 77);

  /* Finds: a small buffer gets only *out_len; NULL arguments; bad UTF-8. */
  ST(rkv_router_stored(r, w, NULL, NULL, NULL, h, 2, t, 0), RKV_OK);
  ST(rkv_router_stored(r, worker(2, 0), NULL, NULL, NULL, h, 1, t, 0), RKV_OK);
  memset(&keep, 0x5a, sizeof keep);
  out[0] = keep;
  len = SENTINEL_LEN;
  ST(rkv_router_find(r, t, 2 * BS, NULL, NULL, out, 1, &len), RKV_BUFFER_TOO_SMALL);
  MSG("cap = 1 is smaller than the 2 scores");
  CHECK(len == 2 && memcmp(&out[0], &keep, sizeof keep) == 0);
  len = SENTINEL_LEN;
  ST(rkv_router_find(r, t, 2 * BS, NULL, NULL, NULL, 0, &len), RKV_BUFFER_TOO_SMALL);
  CHECK(len == 2);
  ST(rkv_router_find(r, t, 2 * BS, NULL, NULL, out, 2, &len), RKV_OK);
  CHECK(len == 2);
  ST(rkv_router_find(NULL, t, 2 * BS, NULL, NULL, out, 2, &len), RKV_NULL_ARGUMENT);
  ST(rkv_router_find(r, NULL, 4, NULL, NULL, out, 2, &len), RKV_NULL_ARGUMENT);
  ST(rkv_router_find(r, t, 2 * BS, NULL, NULL, NULL, 2, &len), RKV_NULL_ARGUMENT);
  ST(rkv_router_find(r, t, 2 * BS, NULL, NULL, out, 2, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_router_find(r, t, 2 * BS, NULL, bad_utf8, out, 2, &len), RKV_INVALID_ARGUMENT);
  MSG("cache_salt is not valid UTF-8");
  ST(rkv_router_find(r, NULL, 0, NULL, NULL, NULL, 0, &len), RKV_OK);
  CHECK(len == 0);
  ST(rkv_router_find_hashes(r, NULL, 1, out, 2, &len), RKV_NULL_ARGUMENT);
  ST(rkv_router_stats_get(r, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_router_dump(r, NULL, 3, &len), RKV_NULL_ARGUMENT);

  /* Malformed payloads: refused whole, counted, the index unchanged. */
  s0 = stats(r);
  ST(rkv_router_apply_batch(r, 1, 0, garbage, sizeof garbage), RKV_INVALID_ARGUMENT);
  MSG("malformed KV-event batch");
  ST(rkv_router_apply_batch(r, 1, 0, BATCH, sizeof BATCH - 1), RKV_INVALID_ARGUMENT);
  ST(rkv_router_apply_batch(r, 1, 0, NULL, 0), RKV_INVALID_ARGUMENT);
  ST(rkv_router_apply_batch(r, 1, 0, NULL, 8), RKV_NULL_ARGUMENT);
  ST(rkv_router_apply_batch(NULL, 1, 0, BATCH, sizeof BATCH), RKV_NULL_ARGUMENT);
  s1 = stats(r);
  CHECK(s1.refused == s0.refused + 3 && s1.blocks == s0.blocks &&
        s1.memberships == s0.memberships && s1.workers == s0.workers);
  ST(rkv_router_next_seq(r, w, &seq), RKV_NOT_FOUND);

  /* Restore refusals: nothing created. */
  {
    rkv_router *x = (rkv_router *)0x10;
    rkv_router_options o = rkv_router_options_default();
    uint8_t buf[512];
    o.block_size = BS;
    ST(rkv_router_dump(r, buf, sizeof buf, &len), RKV_OK);
    ST(rkv_router_restore(&o, buf, len - 1, &x), RKV_INVALID_ARGUMENT);
    MSG("not a router dump");
    buf[0] = 'X';
    ST(rkv_router_restore(&o, buf, len, &x), RKV_INVALID_ARGUMENT);
    buf[0] = 'R';
    o.block_size = 8;
    ST(rkv_router_restore(&o, buf, len, &x), RKV_INVALID_ARGUMENT);
    MSG("block_size 4, but opts->block_size = 8");
    o.block_size = BS;
    ST(rkv_router_restore(&o, NULL, 4, &x), RKV_NULL_ARGUMENT);
    ST(rkv_router_restore(NULL, buf, len, &x), RKV_NULL_ARGUMENT);
    CHECK(x == (rkv_router *)0x10);
    ST(rkv_router_restore(&o, buf, len, &x), RKV_OK);
    rkv_router_free(x);
  }
  rkv_router_free(r);
}

static void test_gap_policies(void) {
  rkv_router *r = make(RKV_GAP_REFUSE);
  rkv_router_score out[2];
  rkv_worker w = worker(9, 0);
  uint32_t bt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint64_t seq = 0;
  size_t len;

  ST(rkv_router_apply_batch(r, 9, 0, BATCH, sizeof BATCH), RKV_OK);
  ST(rkv_router_cleared(r, w), RKV_OK); /* holds nothing; its cursor (1) is kept */
  /* seq 3 skips 1 and 2: refused, nothing applied, next_seq says where to replay. */
  ST(rkv_router_apply_batch(r, 9, 3, BATCH, sizeof BATCH), RKV_SEQUENCE_GAP);
  MSG("expected seq 1, got 3");
  ST(rkv_router_find(r, bt, 8, NULL, NULL, out, 2, &len), RKV_OK);
  CHECK(len == 0);
  ST(rkv_router_next_seq(r, w, &seq), RKV_OK);
  CHECK(seq == 1);
  CHECK(stats(r).gaps == 1 && stats(r).refused == 1);
  /* Replay from 1, then the retry of 3 applies. */
  ST(rkv_router_apply_batch(r, 9, 1, BATCH, sizeof BATCH), RKV_OK);
  ST(rkv_router_apply_batch(r, 9, 2, BATCH, sizeof BATCH), RKV_OK);
  ST(rkv_router_apply_batch(r, 9, 3, BATCH, sizeof BATCH), RKV_OK);
  ST(rkv_router_find(r, bt, 8, NULL, NULL, out, 2, &len), RKV_OK);
  CHECK(len == 1 && is(&out[0], 9, 2, 2));
  ST(rkv_router_next_seq(r, w, &seq), RKV_OK);
  CHECK(seq == 4);
  rkv_router_free(r);

  /* Under RKV_GAP_CLEAR the gap clears the worker, then the batch applies. */
  r = make(RKV_GAP_CLEAR);
  ST(rkv_router_apply_batch(r, 9, 0, BATCH, sizeof BATCH), RKV_OK);
  ST(rkv_router_apply_batch(r, 9, 5, BATCH, sizeof BATCH), RKV_OK);
  ST(rkv_router_find(r, bt, 8, NULL, NULL, out, 2, &len), RKV_OK);
  CHECK(len == 1 && is(&out[0], 9, 2, 2));
  ST(rkv_router_next_seq(r, w, &seq), RKV_OK);
  CHECK(seq == 6 && stats(r).gaps == 1 && stats(r).refused == 0);
  /* A restart (seq below the cursor) too. */
  ST(rkv_router_apply_batch(r, 9, 0, BATCH, sizeof BATCH), RKV_OK);
  CHECK(stats(r).restarts == 1);
  rkv_router_free(r);
}

/* rkv_router_stats_get_ex: a sliding-window group's batch counted in other_groups, the
 * other fields as rkv_router_stats_get's, and its refusals (nothing written). */
static void test_stats_ex(void) {
  rkv_router *r = make(RKV_GAP_CLEAR);
  rkv_router_stats_ex ex, keep;
  rkv_router_stats s;
  rkv_router_score out[2];
  uint32_t bt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  size_t len;
  struct {
    rkv_router_stats_ex ex;
    uint64_t added;
  } later;

  memset(&ex, 0, sizeof ex);
  ex.size = sizeof ex;
  ST(rkv_router_stats_get_ex(r, &ex), RKV_OK);
  CHECK(ex.size == 88 && ex.other_groups == 0 && ex.batches == 0);
  ST(rkv_router_apply_batch(r, 5, 0, BATCH, sizeof BATCH), RKV_OK);
  ST(rkv_router_apply_batch(r, 5, 1, BATCH_SW, sizeof BATCH_SW), RKV_OK);
  /* Worker 5 holds the full group's two blocks only. */
  ST(rkv_router_find(r, bt, 8, NULL, NULL, out, 2, &len), RKV_OK);
  CHECK(len == 1 && is(&out[0], 5, 2, 2));
  memset(&ex, 0xA5, sizeof ex);
  ex.size = sizeof ex;
  ST(rkv_router_stats_get_ex(r, &ex), RKV_OK);
  s = stats(r);
  CHECK(ex.size == sizeof ex && ex.reserved == 0 && ex.other_groups == 1);
  CHECK(ex.workers == s.workers && ex.blocks == s.blocks && ex.memberships == s.memberships &&
        ex.bytes == s.bytes && ex.events == s.events && ex.batches == s.batches &&
        ex.gaps == s.gaps && ex.restarts == s.restarts && ex.refused == s.refused);
  CHECK(ex.workers == 1 && ex.blocks == 2 && ex.events == 2 && ex.batches == 2 &&
        ex.refused == 0);

  /* A caller of a later, larger struct gets this library's fields and size = 88. */
  memset(&later, 0, sizeof later);
  later.ex.size = sizeof later;
  later.added = 0x5eed;
  ST(rkv_router_stats_get_ex(r, &later.ex), RKV_OK);
  CHECK(later.ex.size == 88 && later.ex.other_groups == 1 && later.added == 0x5eed);

  /* Refusals write nothing. */
  memset(&keep, 0x5A, sizeof keep);
  ex = keep;
  ST(rkv_router_stats_get_ex(NULL, &ex), RKV_NULL_ARGUMENT);
  MSG("r is NULL");
  ST(rkv_router_stats_get_ex(r, NULL), RKV_NULL_ARGUMENT);
  MSG("out is NULL");
  keep.size = sizeof(rkv_router_stats); /* the first struct's size: too small */
  ex = keep;
  ST(rkv_router_stats_get_ex(r, &ex), RKV_INVALID_ARGUMENT);
  MSG("out->size = 72 is smaller than an rkv_router_stats_ex (88)");
  CHECK(memcmp(&ex, &keep, sizeof ex) == 0);
  keep.size = 0;
  ex = keep;
  ST(rkv_router_stats_get_ex(r, &ex), RKV_INVALID_ARGUMENT);
  CHECK(memcmp(&ex, &keep, sizeof ex) == 0);
  rkv_router_free(r);
}

int main(void) {
  test_options();
  test_happy_path();
  test_bad_inputs();
  test_gap_policies();
  test_stats_ex();
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
