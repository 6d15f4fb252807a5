/*
 * The KV-event functions of the C ABI (rkv_events_*, rkv_publisher_*, rkv_cache_clear),
 * exercised from C: enabling, naming namespaces, flushing, draining into caller buffers
 * (too small: nothing taken), the spec's hash vectors after an insert/evict cycle,
 * counters, the exclusive reset, and a publisher on tcp://127.0.0.1:* (bad endpoints, an
 * address in use: RKV_IO_ERROR, which only this file produces). Prints "N passed, M
 * failed"; exits non-zero on any failure. (Split out of test_abi.c.)
 */
#define _POSIX_C_SOURCE 200809L
#include "radixkv.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "abi_support.h"

/* ---- KV events (rkv_events_*, rkv_publisher_*; extensions of version 1) ------------- */

/* The spec's vectors (KV_EVENTS.md): tokens 1..16 as one page, seed 1337, and the
   sequence hash of the next page 17..32. */
#define PAGE_1 16863443419780771464ull
#define PAGE_2 12466389667045779788ull

static rkv_cache *make_events(uint32_t page, uint64_t pool) {
  rkv_cache *c = make(page, pool);
  rkv_events_options o = rkv_events_options_default();
  ST(rkv_events_enable(c, &o), RKV_OK);
  return c;
}

/* Inserts tokens from..to (inclusive) into namespace ns of the pooled cache c. */
static void insert_range(const rkv_cache *c, uint64_t ns, uint32_t from, uint32_t to) {
  uint32_t toks[64], slots[64];
  size_t n = (size_t)(to - from + 1), i, existing = 0;
  for (i = 0; i < n; i++) toks[i] = from + (uint32_t)i;
  ST(rkv_alloc(c, n, slots), RKV_OK);
  ST(rkv_insert(c, ns, toks, slots, n, &existing), RKV_OK);
}

static uint64_t flush_seq(const rkv_cache *c) {
  uint64_t seq = 0xA5A5A5A5u;
  ST(rkv_events_flush(c, &seq), RKV_OK);
  return seq;
}

/* Caller buffers for rkv_events_drain, filled with sentinels. */
typedef struct {
  rkv_event ev[8];
  uint64_t h[16];
  uint32_t t[128];
  char s[64];
} drain_bufs;

static void blank(drain_bufs *b) { memset(b, 0xA5, sizeof *b); }

static int untouched(const drain_bufs *b) {
  drain_bufs ref;
  blank(&ref);
  return memcmp(b, &ref, sizeof ref) == 0;
}

static rkv_status drain(const rkv_cache *c, drain_bufs *b, size_t ev_cap, size_t h_cap,
                        size_t t_cap, size_t s_cap, rkv_events_drain_info *info) {
  return note(rkv_events_drain(c, b->ev, ev_cap, b->h, h_cap, b->t, t_cap, b->s, s_cap, info));
}

static void test_events_enable_and_namespaces(void) {
  rkv_events_options d = rkv_events_options_default(), bad;
  rkv_cache *c = make(16, 256), *full = make(16, 256), *plain = make(16, 0);
  drain_bufs *b = (drain_bufs *)malloc(sizeof *b);
  rkv_events_drain_info info;
  rkv_events_stats es;
  uint64_t seq = 7;
  const char not_utf8[3] = {'a', (char)0xff, 0};

  if (!b) abort();
  CHECK(d.hash_mode == RKV_HASH_XXH3 && d.medium == RKV_MEDIUM_GPU);
  CHECK(d.max_drain_batches == 65536);
  ST(rkv_events_enable(NULL, &d), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_enable: cache is NULL");
  ST(rkv_events_enable(c, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_enable: opts is NULL");
  bad = d;
  bad.hash_mode = 2;
  ST(rkv_events_enable(c, &bad), RKV_INVALID_ARGUMENT);
  CHECK_MSG("opts->hash_mode = 2 is not an rkv_hash_mode");
  bad = d;
  bad.medium = 9;
  ST(rkv_events_enable(c, &bad), RKV_INVALID_ARGUMENT);
  CHECK_MSG("opts->medium = 9 is not an rkv_medium");
  /* None of those turned events on. */
  ST(rkv_events_flush(c, &seq), RKV_INVALID_ARGUMENT);
  CHECK_MSG("rkv_events_flush: events are not enabled on this cache");
  CHECK(seq == 7);
  ST(rkv_events_enable(c, &d), RKV_OK);
  CHECK(rkv_last_error_message()[0] == '\0');
  ST(rkv_events_enable(c, &d), RKV_INVALID_ARGUMENT); /* twice */
  CHECK_MSG("events are enabled on this cache already");

  /* A cache with pages is refused, and keeps working without events. */
  insert_range(full, 0, 1, 16);
  ST(rkv_events_enable(full, &d), RKV_INVALID_ARGUMENT);
  CHECK_MSG("the cache is not empty (16 tokens cached in 1 namespaces)");
  insert_range(full, 0, 1, 32);
  CHECK(stats(full).cached_tokens == 32);
  ST(rkv_events_counters(full, &es), RKV_INVALID_ARGUMENT);
  CHECK_MSG("events are not enabled");

  /* Namespaces: named before their first insert, NULL for none. */
  ST(rkv_events_set_namespace(NULL, 1, "a", NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_set_namespace: cache is NULL");
  ST(rkv_events_set_namespace(plain, 1, "a", NULL), RKV_INVALID_ARGUMENT);
  CHECK_MSG("events are not enabled");
  ST(rkv_events_set_namespace(c, 1, NULL, not_utf8), RKV_INVALID_ARGUMENT);
  CHECK_MSG("cache_salt is not valid UTF-8");
  ST(rkv_events_set_namespace(c, 1, "", NULL), RKV_INVALID_ARGUMENT);
  CHECK_MSG("may not be empty");
  ST(rkv_events_set_namespace(c, 1, "adapter-a", "tenant"), RKV_OK);
  ST(rkv_events_set_namespace(c, 2, "adapter-b", NULL), RKV_OK);
  ST(rkv_events_set_namespace(c, 0, NULL, NULL), RKV_OK);
  insert_range(c, 1, 1, 16);
  insert_range(c, 2, 1, 16);
  insert_range(c, 3, 1, 16);
  insert_range(c, 0, 1, 16);
  ST(rkv_events_set_namespace(c, 1, NULL, NULL), RKV_INVALID_ARGUMENT);
  CHECK_MSG("namespace 1 already has hashed pages");
  CHECK(flush_seq(c) == 0);
  blank(b);
  ST(drain(c, b, 8, 16, 128, 64, &info), RKV_OK);
  CHECK(info.n_batches == 1 && info.n_events == 4 && info.n_hashes == 4);
  CHECK(info.n_tokens == 64 && info.batches_left == 0);
  /* "adapter-a\0tenant\0adapter-b\0" "3\0" */
  CHECK(info.n_string_bytes == 10 + 7 + 10 + 2);
  CHECK(b->ev[0].lora_name && strcmp(b->ev[0].lora_name, "adapter-a") == 0);
  CHECK(b->ev[0].cache_salt && strcmp(b->ev[0].cache_salt, "tenant") == 0);
  CHECK(b->ev[1].lora_name && strcmp(b->ev[1].lora_name, "adapter-b") == 0);
  CHECK(b->ev[1].cache_salt == NULL);
  CHECK(b->ev[2].lora_name == NULL && b->ev[2].cache_salt && strcmp(b->ev[2].cache_salt, "3") == 0);
  CHECK(b->ev[3].lora_name == NULL && b->ev[3].cache_salt == NULL); /* the base model */
  CHECK(b->ev[3].block_hashes[0] == PAGE_1);
  /* Same tokens, four namespaces: four different hashes. */
  CHECK(b->ev[0].block_hashes[0] != b->ev[1].block_hashes[0]);
  CHECK(b->ev[0].block_hashes[0] != b->ev[2].block_hashes[0]);
  CHECK(b->ev[1].block_hashes[0] != b->ev[2].block_hashes[0]);
  CHECK(b->ev[2].block_hashes[0] != PAGE_1 && b->ev[0].block_hashes[0] != PAGE_1);
  ST(rkv_events_counters(c, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_counters: out_stats is NULL");
  memset(&es, 0, sizeof es);
  ST(rkv_events_counters(c, &es), RKV_OK);
  CHECK(es.batches == 1 && es.events == 4 && es.dropped == 0);

  free(b);
  rkv_cache_free(plain);
  rkv_cache_free(full);
  rkv_cache_free(c);
}

static void test_events_flush_and_drain(void) {
  rkv_cache *c = make_events(16, 256);
  drain_bufs *b = (drain_bufs *)malloc(sizeof *b);
  rkv_events_drain_info info, want;
  uint64_t seq = 7, sorted[2];
  size_t n = 0, i;
  rkv_events_stats es;

  if (!b) abort();
  ST(rkv_events_flush(NULL, &seq), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_flush: cache is NULL");
  ST(rkv_events_flush(c, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_flush: out_seq is NULL");
  CHECK(seq == 7);
  CHECK(flush_seq(c) == RKV_EVENTS_NO_SEQ); /* nothing recorded: no batch */
  /* Nothing queued: OK, all zeros, and the buffers may be NULL with capacity 0. */
  memset(&info, 0xA5, sizeof info);
  ST(rkv_events_drain(c, NULL, 0, NULL, 0, NULL, 0, NULL, 0, &info), RKV_OK);
  CHECK(info.n_batches == 0 && info.n_events == 0 && info.batches_left == 0);

  insert_range(c, 0, 1, 16);
  CHECK(flush_seq(c) == 0);
  insert_range(c, 0, 1, 32);
  CHECK(flush_seq(c) == 1);
  CHECK(flush_seq(c) == RKV_EVENTS_NO_SEQ);

  /* Bad buffers: a status, a message, nothing written or taken. */
  memset(&info, 0xA5, sizeof info);
  memcpy(&want, &info, sizeof info);
  ST(rkv_events_drain(NULL, b->ev, 8, b->h, 16, b->t, 128, b->s, 64, &info), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_drain: cache is NULL");
  ST(rkv_events_drain(c, NULL, 8, b->h, 16, b->t, 128, b->s, 64, &info), RKV_NULL_ARGUMENT);
  CHECK_MSG("out_events is NULL but events_cap = 8");
  ST(rkv_events_drain(c, b->ev, 8, NULL, 16, b->t, 128, b->s, 64, &info), RKV_NULL_ARGUMENT);
  CHECK_MSG("out_hashes is NULL but hashes_cap = 16");
  ST(rkv_events_drain(c, b->ev, 8, b->h, 16, NULL, 128, b->s, 64, &info), RKV_NULL_ARGUMENT);
  CHECK_MSG("out_tokens is NULL but tokens_cap = 128");
  ST(rkv_events_drain(c, b->ev, 8, b->h, 16, b->t, 128, NULL, 64, &info), RKV_NULL_ARGUMENT);
  CHECK_MSG("out_strings is NULL but strings_cap = 64");
  ST(rkv_events_drain(c, b->ev, 8, b->h, 16, b->t, 128, b->s, 64, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_drain: out_info is NULL");
  CHECK(memcmp(&info, &want, sizeof info) == 0);

  /* Too small (15 tokens for a 16-token batch): nothing taken, only *out_info written,
     with what every buffer needs for both batches. */
  blank(b);
  ST(drain(c, b, 8, 16, 15, 64, &info), RKV_BUFFER_TOO_SMALL);
  printf("message: %s\n", rkv_last_error_message());
  CHECK_MSG("the first of the 2 queued batches does not fit");
  CHECK_MSG("nothing was taken");
  CHECK(info.n_batches == 2 && info.n_events == 2 && info.n_hashes == 2);
  CHECK(info.n_tokens == 32 && info.n_string_bytes == 0 && info.batches_left == 2);
  CHECK(untouched(b));
  /* Measuring: every capacity 0. */
  ST(rkv_events_drain(c, NULL, 0, NULL, 0, NULL, 0, NULL, 0, &info), RKV_BUFFER_TOO_SMALL);
  CHECK(info.n_events == 2 && info.n_tokens == 32);
  /* Room for the first batch only: it is taken, the second stays. */
  ST(drain(c, b, 1, 1, 16, 0, &info), RKV_OK);
  CHECK(info.n_batches == 1 && info.n_events == 1 && info.n_hashes == 1);
  CHECK(info.n_tokens == 16 && info.batches_left == 1);
  CHECK(b->ev[0].seq == 0 && b->ev[0].kind == RKV_EVENT_BLOCK_STORED);
  CHECK(b->ev[0].block_size == 16 && b->ev[0].has_parent == 0);
  CHECK(b->ev[0].n_block_hashes == 1 && b->ev[0].block_hashes == b->h);
  CHECK(b->h[0] == PAGE_1);
  CHECK(b->ev[0].n_token_ids == 16 && b->ev[0].token_ids == b->t);
  CHECK(b->t[0] == 1 && b->t[15] == 16);
  CHECK(b->ev[0].lora_name == NULL && b->ev[0].cache_salt == NULL);
  CHECK(b->ev[0].ts > 1.6e9); /* seconds since the epoch */
  blank(b);
  ST(drain(c, b, 8, 16, 128, 64, &info), RKV_OK);
  CHECK(info.n_batches == 1 && info.batches_left == 0);
  CHECK(b->ev[0].seq == 1 && b->ev[0].has_parent == 1 && b->ev[0].parent_block_hash == PAGE_1);
  CHECK(b->ev[0].n_block_hashes == 1 && b->ev[0].block_hashes[0] == PAGE_2);
  CHECK(b->ev[0].n_token_ids == 16 && b->ev[0].token_ids[0] == 17);

  /* An insert/evict cycle: the removal of both pages (child leaf, then its parent: one
     event, adjacent removals merge), a store of both, their removal, a re-store of one. */
  ST(rkv_evict(c, SIZE_MAX, NULL, NULL, &n), RKV_OK);
  CHECK(n == 32);
  insert_range(c, 0, 1, 32);
  ST(rkv_evict(c, SIZE_MAX, NULL, NULL, &n), RKV_OK);
  insert_range(c, 0, 1, 16);
  CHECK(flush_seq(c) == 2);
  blank(b);
  ST(drain(c, b, 8, 16, 128, 64, &info), RKV_OK);
  CHECK(info.n_batches == 1 && info.n_events == 4 && info.n_hashes == 7 && info.n_tokens == 48);
  CHECK(b->ev[0].kind == RKV_EVENT_BLOCK_REMOVED && b->ev[0].n_block_hashes == 2);
  CHECK(b->ev[0].block_size == 0 && b->ev[0].token_ids == NULL && b->ev[0].n_token_ids == 0);
  CHECK(b->ev[0].medium == RKV_MEDIUM_GPU);
  CHECK(b->ev[1].kind == RKV_EVENT_BLOCK_STORED && b->ev[1].has_parent == 0);
  CHECK(b->ev[1].n_block_hashes == 2);
  CHECK(b->ev[1].block_hashes[0] == PAGE_1 && b->ev[1].block_hashes[1] == PAGE_2);
  CHECK(b->ev[1].n_token_ids == 32 && b->ev[1].token_ids[31] == 32);
  CHECK(b->ev[2].kind == RKV_EVENT_BLOCK_REMOVED && b->ev[2].n_block_hashes == 2);
  for (i = 0; i < 2; i++) sorted[i] = b->ev[2].block_hashes[i];
  CHECK((sorted[0] == PAGE_1 && sorted[1] == PAGE_2) || (sorted[0] == PAGE_2 && sorted[1] == PAGE_1));
  CHECK(b->ev[3].kind == RKV_EVENT_BLOCK_STORED && b->ev[3].n_block_hashes == 1);
  CHECK(b->ev[3].block_hashes[0] == PAGE_1 && b->ev[3].block_hashes == b->h + 6);
  memset(&es, 0, sizeof es);
  ST(rkv_events_counters(c, &es), RKV_OK);
  CHECK(es.batches == 3 && es.dropped == 0);

  free(b);
  rkv_cache_free(c);
}

/* A TCP port held by a plain listening socket on 127.0.0.1 (0 if none could be had);
   *fd gets the socket, to close afterwards. */
static int held_port(int *fd) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  *fd = socket(AF_INET, SOCK_STREAM, 0);
  if (*fd < 0) return 0;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(*fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(*fd, 1) != 0 ||
      getsockname(*fd, (struct sockaddr *)&a, &len) != 0)
    return 0;
  return (int)ntohs(a.sin_port);
}

static rkv_publisher_options quick_publisher(void) {
  rkv_publisher_options o = rkv_publisher_options_default();
  o.endpoint = "tcp://127.0.0.1:*";
  o.linger_ms = 0;
  o.auto_flush_ms = 0; /* only rkv_events_flush closes batches: the counts are exact */
  return o;
}

/* rkv_cache_clear: the exclusive reset. With events on and nothing pinned it publishes one
   ALL_BLOCKS_CLEARED and leaves the cache empty; with a lock it drops the rest and
   publishes their removals; NULL is refused; the callback gets every dropped slot. */
static void test_cache_clear(void) {
  rkv_cache *c = make_events(16, 256), *plain = make(1, 0);
  drain_bufs *b = (drain_bufs *)malloc(sizeof *b);
  collector *k = new_collector();
  rkv_events_drain_info info;
  rkv_stats s;
  uint32_t toks[32], slots[32], out[32];
  size_t n = 0, i, existing = 0;
  rkv_lock lock = 0;

  if (!b) abort();
  ST(rkv_cache_clear(NULL, NULL, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_cache_clear: cache is NULL");
  ST(rkv_cache_clear(NULL, collect, k), RKV_NULL_ARGUMENT);
  CHECK(k->calls == 0);

  /* An empty cache: OK, and no event at all. */
  ST(rkv_cache_clear(c, NULL, NULL), RKV_OK);
  CHECK(strcmp(rkv_last_error_message(), "") == 0);
  CHECK(flush_seq(c) == RKV_EVENTS_NO_SEQ);

  /* Two pages in two namespaces, nothing pinned: one ALL_BLOCKS_CLEARED, an empty cache,
     every slot back in the pool. */
  insert_range(c, 0, 1, 32);
  insert_range(c, 5, 1, 16);
  flush_seq(c);
  blank(b);
  ST(drain(c, b, 8, 16, 128, 64, &info), RKV_OK);
  CHECK(info.n_hashes == 3 && info.batches_left == 0); /* stored: 2 + 1 pages */
  ST(rkv_cache_clear(c, NULL, NULL), RKV_OK);
  s = stats(c);
  CHECK(s.cached_tokens == 0 && s.nodes == 0 && s.free_slots == 256);
  CHECK(rkv_match(c, 0, (toks[0] = 1, toks), 1, NULL, 0, &n) == RKV_OK && n == 0);
  CHECK(flush_seq(c) != RKV_EVENTS_NO_SEQ);
  blank(b);
  ST(drain(c, b, 8, 16, 128, 64, &info), RKV_OK);
  CHECK(info.n_batches == 1 && info.n_events == 1 && info.n_hashes == 0);
  CHECK(b->ev[0].kind == RKV_EVENT_ALL_BLOCKS_CLEARED);

  /* A lock keeps its page: the other one goes, published as a removal, no clear. */
  insert_range(c, 0, 1, 32);
  flush_seq(c);
  ST(drain(c, b, 8, 16, 128, 64, &info), RKV_OK);
  for (i = 0; i < 32; i++) toks[i] = (uint32_t)i + 1;
  ST(rkv_match_lock(c, 0, toks, 16, out, 32, &n, &lock), RKV_OK);
  CHECK(n == 16);
  ST(rkv_cache_clear(c, NULL, NULL), RKV_OK);
  s = stats(c);
  CHECK(s.cached_tokens == 16 && s.protected_tokens == 16);
  flush_seq(c);
  blank(b);
  ST(drain(c, b, 8, 16, 128, 64, &info), RKV_OK);
  CHECK(info.n_events == 1 && b->ev[0].kind == RKV_EVENT_BLOCK_REMOVED);
  CHECK(b->ev[0].n_block_hashes == 1 && b->ev[0].block_hashes[0] == PAGE_2);
  ST(rkv_release(c, lock), RKV_OK);
  ST(rkv_cache_clear(c, NULL, NULL), RKV_OK);
  CHECK(stats(c).cached_tokens == 0);
  flush_seq(c);
  ST(drain(c, b, 8, 16, 128, 64, &info), RKV_OK);
  CHECK(info.n_events == 1 && b->ev[0].kind == RKV_EVENT_ALL_BLOCKS_CLEARED);

  /* Caller-managed, no events: the callback gets every dropped slot exactly once; with a
     NULL callback the slots are simply not reported. */
  for (i = 0; i < 8; i++) {
    toks[i] = (uint32_t)i + 100;
    slots[i] = (uint32_t)i + 40;
  }
  ST(rkv_insert(plain, 0, toks, slots, 8, &existing), RKV_OK);
  ST(rkv_cache_clear(plain, collect, k), RKV_OK);
  CHECK(k->total == 8 && each_at_most_once(k) && k->seen[40] == 1 && k->seen[47] == 1);
  CHECK(stats(plain).cached_tokens == 0 && stats(plain).nodes == 0);
  ST(rkv_insert(plain, 0, toks, slots, 8, &existing), RKV_OK);
  ST(rkv_cache_clear(plain, NULL, NULL), RKV_OK);
  CHECK(stats(plain).cached_tokens == 0);

  free(k);
  free(b);
  rkv_cache_free(plain);
  rkv_cache_free(c);
}

static void test_events_publisher(void) {
  rkv_cache *c = make_events(16, 256), *plain = make(16, 0);
  rkv_publisher_options d = rkv_publisher_options_default(), o;
  rkv_publisher *sentinel = (rkv_publisher *)(uintptr_t)0x10, *p = sentinel, *p2 = sentinel;
  rkv_publisher_stats ps;
  rkv_events_drain_info info;
  const char *ep = NULL, *replay = NULL;
  char taken_pub[64], taken[64];
  const char not_utf8[2] = {(char)0xc3, 0};
  int fd = -1, port;

  CHECK(strcmp(d.endpoint, "tcp://*:5557") == 0 && d.replay_endpoint == NULL && d.topic == NULL);
  CHECK(d.encoding == RKV_ENCODING_VLLM_ARRAY && d.buffer_steps == 10000);
  CHECK(d.max_queue == 100000 && d.auto_flush_ms == 10 && d.linger_ms == 1000);
  CHECK(d.data_parallel_rank == 0);

  o = quick_publisher();
  ST(rkv_events_publish(NULL, &o, &p), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_publish: cache is NULL");
  ST(rkv_events_publish(c, NULL, &p), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_publish: opts is NULL");
  ST(rkv_events_publish(c, &o, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_events_publish: out_publisher is NULL");
  o.endpoint = NULL;
  ST(rkv_events_publish(c, &o, &p), RKV_NULL_ARGUMENT);
  CHECK_MSG("opts->endpoint is NULL");
  o.endpoint = "nonsense";
  ST(rkv_events_publish(c, &o, &p), RKV_INVALID_ARGUMENT);
  printf("message: %s\n", rkv_last_error_message());
  CHECK_MSG("\"nonsense\"");
  o.endpoint = "tcp://*:notaport";
  ST(rkv_events_publish(c, &o, &p), RKV_INVALID_ARGUMENT);
  CHECK_MSG("tcp://*:notaport");
  o.endpoint = "inproc://x";
  ST(rkv_events_publish(c, &o, &p), RKV_INVALID_ARGUMENT);
  CHECK_MSG("inproc:// is not supported");
  o = quick_publisher();
  o.encoding = 5;
  ST(rkv_events_publish(c, &o, &p), RKV_INVALID_ARGUMENT);
  CHECK_MSG("opts->encoding = 5 is not an rkv_encoding");
  o = quick_publisher();
  o.max_queue = 0;
  ST(rkv_events_publish(c, &o, &p), RKV_INVALID_ARGUMENT);
  CHECK_MSG("opts->max_queue = 0");
  o = quick_publisher();
  o.topic = not_utf8;
  ST(rkv_events_publish(c, &o, &p), RKV_INVALID_ARGUMENT);
  CHECK_MSG("opts->topic is not valid UTF-8");
  o = quick_publisher();
  ST(rkv_events_publish(plain, &o, &p), RKV_INVALID_ARGUMENT);
  CHECK_MSG("events are not enabled");

  /* An address in use is the environment's refusal: RKV_IO_ERROR (the PUB socket binds an
     endpoint with a '*'; the replay socket always binds). */
  port = held_port(&fd);
  CHECK(port > 0);
  snprintf(taken_pub, sizeof taken_pub, "tcp://*:%d", port);
  snprintf(taken, sizeof taken, "tcp://127.0.0.1:%d", port);
  o = quick_publisher();
  o.endpoint = taken_pub;
  ST(rkv_events_publish(c, &o, &p), RKV_IO_ERROR);
  printf("message: %s\n", rkv_last_error_message());
  CHECK_MSG("rkv_events_publish: I/O error");
  CHECK_MSG("in use");
  o = quick_publisher();
  o.replay_endpoint = taken;
  ST(rkv_events_publish(c, &o, &p), RKV_IO_ERROR);
  CHECK_MSG("in use");
  if (fd >= 0) close(fd);
  CHECK(p == sentinel); /* no output on any failure */

  /* None of the failures attached anything: the cache still drains. */
  insert_range(c, 0, 1, 16);
  CHECK(flush_seq(c) == 0);
  ST(rkv_events_drain(c, NULL, 0, NULL, 0, NULL, 0, NULL, 0, &info), RKV_BUFFER_TOO_SMALL);
  CHECK(info.n_batches == 1);

  /* A publisher on a free port, with replay; the queued batch goes to it. */
  o = quick_publisher();
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.topic = "kv@127.0.0.1:0@model";
  o.encoding = RKV_ENCODING_VLLM_MAP;
  ST(rkv_events_publish(c, &o, &p), RKV_OK);
  CHECK(p != sentinel && p != NULL);
  ST(rkv_events_publish(c, &o, &p2), RKV_INVALID_ARGUMENT); /* one per cache */
  CHECK_MSG("a publisher is attached");
  CHECK(p2 == sentinel);
  ST(rkv_publisher_endpoint(NULL, &ep, &replay), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_publisher_endpoint: publisher is NULL");
  ST(rkv_publisher_endpoint(p, NULL, &replay), RKV_NULL_ARGUMENT);
  CHECK_MSG("out_endpoint is NULL");
  ST(rkv_publisher_endpoint(p, &ep, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("out_replay_endpoint is NULL");
  CHECK(ep == NULL && replay == NULL);
  ST(rkv_publisher_endpoint(p, &ep, &replay), RKV_OK);
  CHECK(ep != NULL && strncmp(ep, "tcp://127.0.0.1:", 16) == 0 && strchr(ep, '*') == NULL);
  CHECK(replay != NULL && strncmp(replay, "tcp://127.0.0.1:", 16) == 0 && strcmp(ep, replay) != 0);
  printf("publisher on %s, replay on %s\n", ep ? ep : "?", replay ? replay : "?");
  ST(rkv_publisher_counters(NULL, &ps), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_publisher_counters: publisher is NULL");
  ST(rkv_publisher_counters(p, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_publisher_counters: out_stats is NULL");
  ST(rkv_publisher_stop(NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_publisher_stop: publisher is NULL");
  /* While attached, batches go to the publisher: the drain queue stays empty. */
  insert_range(c, 0, 1, 32);
  CHECK(flush_seq(c) == 1);
  memset(&info, 0xA5, sizeof info);
  ST(rkv_events_drain(c, NULL, 0, NULL, 0, NULL, 0, NULL, 0, &info), RKV_OK);
  CHECK(info.n_batches == 0 && info.batches_left == 0);
  insert_range(c, 0, 1, 48); /* pending: the stop flushes it to the publisher */
  ST(rkv_publisher_stop(p), RKV_OK);
  ST(rkv_publisher_stop(p), RKV_OK); /* stopped already: nothing to do */
  memset(&ps, 0xA5, sizeof ps);
  ST(rkv_publisher_counters(p, &ps), RKV_OK);
  CHECK(ps.published + ps.dropped == 3 && ps.dropped == 0);
  ST(rkv_publisher_endpoint(p, &ep, &replay), RKV_OK); /* still valid after the stop */
  CHECK(ep != NULL && replay != NULL);
  rkv_publisher_free(p);
  rkv_publisher_free(NULL);

  /* Stopped, the cache drains again; another publisher may start, and it may outlive the
     cache: stopping and freeing it after rkv_cache_free is safe. */
  insert_range(c, 0, 1, 64);
  CHECK(flush_seq(c) == 3);
  ST(rkv_events_drain(c, NULL, 0, NULL, 0, NULL, 0, NULL, 0, &info), RKV_BUFFER_TOO_SMALL);
  CHECK(info.n_batches == 1);
  o = quick_publisher();
  ST(rkv_events_publish(c, &o, &p), RKV_OK);
  rkv_cache_free(c);
  ST(rkv_publisher_counters(p, &ps), RKV_OK);
  ST(rkv_publisher_stop(p), RKV_OK);
  ST(rkv_publisher_counters(p, &ps), RKV_OK);
  CHECK(ps.published + ps.dropped == 1); /* the batch that was queued when it started */
  rkv_publisher_free(p);
  /* A running publisher freed (without a stop) stops itself. */
  c = make_events(16, 256);
  ST(rkv_events_publish(c, &o, &p), RKV_OK);
  rkv_publisher_free(p);
  rkv_cache_free(c);
  rkv_cache_free(plain);
}


int main(void) {
  test_events_enable_and_namespaces();
  test_events_flush_and_drain();
  test_cache_clear();
  test_events_publisher();
  if (!produced[RKV_IO_ERROR]) {
    failed++;
    fprintf(stderr, "status %d (%s) was never produced\n", (int)RKV_IO_ERROR,
            rkv_status_str(RKV_IO_ERROR));
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
