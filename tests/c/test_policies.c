/*
 * The eviction policies through the C ABI (rkv_options.eviction_policy, the policy
 * numbers and names) and rkv_insert_ex (per-insert priority, its refusals): each
 * policy's eviction order, checked from C. Prints "N passed, M failed"; exits non-zero on
 * any failure. (Split out of test_abi.c.)
 */
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

/* ---- eviction policies and per-insert options (extensions of version 1) ---------- */

/* The slots an eviction frees, in the order it frees them. */
typedef struct {
  uint32_t got[256];
  size_t n;
} order_log;

static void log_slots(void *ctx, const uint32_t *slots, size_t n) {
  order_log *k = (order_log *)ctx;
  size_t i;
  for (i = 0; i < n; i++)
    if (k->n < sizeof k->got / sizeof k->got[0]) k->got[k->n++] = slots[i];
}

static rkv_cache *make_policy(uint32_t policy, uint64_t pool, uint32_t slru_threshold) {
  rkv_options o = rkv_options_default();
  rkv_policy_options p = rkv_policy_options_default();
  rkv_cache *c = NULL;
  o.eviction_policy = policy;
  o.pool_slots = pool;
  p.slru_threshold = slru_threshold;
  ST(rkv_cache_new_with(&o, &p, &c), RKV_OK);
  CHECK(c != NULL);
  return c;
}

/* Caches the two-token leaf {first, first + 1} with slots {first * 10, first * 10 + 1}
   (its own leaf under the root: first tokens differ) at `priority`, `inserted_len` 0. */
static void put(const rkv_cache *c, uint32_t first, int64_t priority) {
  const uint32_t toks[2] = {first, first + 1};
  const uint32_t slots[2] = {first * 10, first * 10 + 1};
  rkv_insert_options o = rkv_insert_options_default();
  size_t existing = SENTINEL_LEN;
  o.priority = priority;
  ST(rkv_insert_ex(c, 0, toks, slots, 2, &o, &existing), RKV_OK);
}

/* Touches leaf `first` (a plain match of its two tokens). */
static void touch(const rkv_cache *c, uint32_t first) {
  const uint32_t toks[2] = {first, first + 1};
  size_t n = 0;
  ST(rkv_match(c, 0, toks, 2, NULL, 0, &n), RKV_OK);
  CHECK(n == 2);
}

/* Evicts one leaf (two tokens) and returns the first token of the leaf that went (its
   slot / 10), or 0 if not exactly one leaf of `put` went. */
static uint32_t evict_one(const rkv_cache *c) {
  order_log k;
  size_t n = SENTINEL_LEN;
  memset(&k, 0, sizeof k);
  ST(rkv_evict(c, 1, log_slots, &k, &n), RKV_OK);
  if (n != 2 || k.n != 2 || k.got[1] != k.got[0] + 1 || k.got[0] % 10 != 0) return 0;
  return k.got[0] / 10;
}

static void test_policy_numbers_and_names(void) {
  static const char *const names[7] = {"lru", "fifo", "lfu", "mru", "filo", "priority", "slru"};
  uint32_t i, p = 0xDEAD, thr = 0xBEEF;
  rkv_cache *c = (rkv_cache *)(uintptr_t)0x1234;
  rkv_options o = rkv_options_default();
  rkv_policy_options po = rkv_policy_options_default();
  char upper[16];

  CHECK(RKV_EVICT_LRU == 0 && RKV_EVICT_FIFO == 1 && RKV_EVICT_LFU == 2 && RKV_EVICT_MRU == 3 &&
        RKV_EVICT_FILO == 4 && RKV_EVICT_PRIORITY == 5 && RKV_EVICT_SLRU == 6);
  CHECK(RKV_DEFAULT_SLRU_THRESHOLD == 2);
  CHECK(sizeof(rkv_policy_options) == 12 && sizeof(rkv_insert_options) == 24);
  CHECK(po.size == sizeof po && po.slru_threshold == RKV_DEFAULT_SLRU_THRESHOLD && po.swa_window == 0);
  {
    rkv_insert_options io = rkv_insert_options_default();
    CHECK(io.size == sizeof io && io.reserved == 0 && io.priority == 0 && io.inserted_len == 0);
  }

  for (i = 0; i < 7; i++) {
    const char *n = rkv_eviction_policy_name(i);
    size_t j;
    CHECK(n != NULL && strcmp(n, names[i]) == 0);
    CHECK(n == rkv_eviction_policy_name(i)); /* static */
    p = 0xDEAD;
    ST(rkv_eviction_policy_from_name(names[i], &p), RKV_OK);
    CHECK(p == i);
    for (j = 0; names[i][j]; j++) upper[j] = (char)(names[i][j] - 'a' + 'A');
    upper[j] = '\0';
    p = 0xDEAD;
    ST(rkv_eviction_policy_from_name(upper, &p), RKV_OK); /* case ignored */
    CHECK(p == i);
    /* Every number makes a cache, which reports it back with the default threshold. */
    o.eviction_policy = i;
    ST(rkv_cache_new(&o, &c), RKV_OK);
    p = thr = 0xDEAD;
    ST(rkv_cache_eviction_policy(c, &p, &thr), RKV_OK);
    CHECK(p == i && thr == RKV_DEFAULT_SLRU_THRESHOLD);
    rkv_cache_free(c);
  }
  CHECK(rkv_eviction_policy_name(7) == NULL);
  CHECK(rkv_eviction_policy_name(0xFFFFFFFFu) == NULL);

  p = 0xDEAD;
  ST(rkv_eviction_policy_from_name("tlru", &p), RKV_INVALID_ARGUMENT);
  printf("message: %s\n", rkv_last_error_message());
  CHECK_MSG("rkv_eviction_policy_from_name: name: unknown eviction policy \"tlru\"");
  CHECK_MSG("lru, lfu, fifo, mru, filo, priority, slru");
  ST(rkv_eviction_policy_from_name("", &p), RKV_INVALID_ARGUMENT);
  ST(rkv_eviction_policy_from_name(NULL, &p), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_eviction_policy_from_name: name is NULL");
  ST(rkv_eviction_policy_from_name("lru", NULL), RKV_NULL_ARGUMENT);
  CHECK(p == 0xDEAD);

  /* An unknown number lists the valid ones. */
  c = (rkv_cache *)(uintptr_t)0x1234;
  o.eviction_policy = 7;
  ST(rkv_cache_new(&o, &c), RKV_INVALID_ARGUMENT);
  printf("message: %s\n", rkv_last_error_message());
  CHECK_MSG("rkv_cache_new: opts->eviction_policy = 7 is not an rkv_eviction_policy (0 = "
            "RKV_EVICT_LRU, 1 = RKV_EVICT_FIFO, 2 = RKV_EVICT_LFU, 3 = RKV_EVICT_MRU, 4 = "
            "RKV_EVICT_FILO, 5 = RKV_EVICT_PRIORITY, 6 = RKV_EVICT_SLRU)");
  o.eviction_policy = 0xFFFFFFFFu;
  ST(rkv_cache_new_with(&o, &po, &c), RKV_INVALID_ARGUMENT);
  CHECK_MSG("rkv_cache_new_with: opts->eviction_policy = 4294967295");

  /* rkv_cache_new_with: NULLs, a bad size, the threshold read back. */
  o.eviction_policy = RKV_EVICT_SLRU;
  ST(rkv_cache_new_with(NULL, &po, &c), RKV_NULL_ARGUMENT);
  ST(rkv_cache_new_with(&o, &po, NULL), RKV_NULL_ARGUMENT);
  po.size = 4;
  ST(rkv_cache_new_with(&o, &po, &c), RKV_INVALID_ARGUMENT);
  CHECK_MSG("rkv_cache_new_with: policy->size = 4 is not the size of an rkv_policy_options");
  po.size = 0;
  ST(rkv_cache_new_with(&o, &po, &c), RKV_INVALID_ARGUMENT);
  CHECK(c == (rkv_cache *)(uintptr_t)0x1234); /* untouched on errors */
  po = rkv_policy_options_default();
  po.slru_threshold = 5;
  ST(rkv_cache_new_with(&o, &po, &c), RKV_OK);
  CHECK(rkv_last_error_message()[0] == '\0');
  p = thr = 0xDEAD;
  ST(rkv_cache_eviction_policy(NULL, &p, &thr), RKV_NULL_ARGUMENT);
  ST(rkv_cache_eviction_policy(c, NULL, &thr), RKV_NULL_ARGUMENT);
  ST(rkv_cache_eviction_policy(c, &p, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_cache_eviction_policy: out_slru_threshold is NULL");
  CHECK(p == 0xDEAD && thr == 0xDEAD);
  ST(rkv_cache_eviction_policy(c, &p, &thr), RKV_OK);
  CHECK(p == RKV_EVICT_SLRU && thr == 5);
  rkv_cache_free(c);
  ST(rkv_cache_new_with(&o, NULL, &c), RKV_OK); /* NULL: the defaults */
  ST(rkv_cache_eviction_policy(c, &p, &thr), RKV_OK);
  CHECK(p == RKV_EVICT_SLRU && thr == RKV_DEFAULT_SLRU_THRESHOLD);
  rkv_cache_free(c);
}

static void test_insert_ex_refusals(void) {
  rkv_cache *c = make_policy(RKV_EVICT_PRIORITY, 64, RKV_DEFAULT_SLRU_THRESHOLD);
  const uint32_t toks[4] = {1, 2, 3, 4};
  uint32_t s[4];
  rkv_slot_run runs[4];
  size_t existing = SENTINEL_LEN, i;
  rkv_lock l = SENTINEL_LOCK;
  rkv_insert_options o = rkv_insert_options_default();
  rkv_stats st;
  const int64_t bad_priorities[3] = {(int64_t)INT32_MAX + 1, (int64_t)INT32_MIN - 1, INT64_MIN};

  ST(rkv_alloc(c, 4, s), RKV_OK);
  for (i = 0; i < 4; i++) {
    runs[i].start = s[i];
    runs[i].len = 1;
  }
  /* Every function refuses a NULL cache. */
  ST(rkv_insert_ex(NULL, 0, toks, s, 4, &o, &existing), RKV_NULL_ARGUMENT);
  ST(rkv_insert_lock_ex(NULL, 0, toks, s, 4, &o, &existing, &l), RKV_NULL_ARGUMENT);
  ST(rkv_insert_runs_ex(NULL, 0, toks, 4, runs, 4, &o, &existing), RKV_NULL_ARGUMENT);
  ST(rkv_insert_lock_runs_ex(NULL, 0, toks, 4, runs, 4, &o, &existing, &l), RKV_NULL_ARGUMENT);
  /* NULL arrays with a length, NULL outputs. */
  ST(rkv_insert_ex(c, 0, NULL, s, 4, &o, &existing), RKV_NULL_ARGUMENT);
  ST(rkv_insert_ex(c, 0, toks, NULL, 4, &o, &existing), RKV_NULL_ARGUMENT);
  ST(rkv_insert_ex(c, 0, toks, s, 4, &o, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_insert_ex: out_existing is NULL");
  ST(rkv_insert_lock_ex(c, 0, toks, s, 4, &o, &existing, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_insert_lock_ex: out_lock is NULL");
  ST(rkv_insert_runs_ex(c, 0, toks, 4, NULL, 4, &o, &existing), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_insert_runs_ex: runs is NULL but n_runs = 4");
  ST(rkv_insert_lock_runs_ex(c, 0, toks, 4, runs, 4, &o, NULL, &l), RKV_NULL_ARGUMENT);
  ST(rkv_insert_lock_runs_ex(c, 0, toks, 4, runs, 4, &o, &existing, NULL), RKV_NULL_ARGUMENT);
  /* A priority outside int32_t, by every function. */
  for (i = 0; i < 3; i++) {
    o.priority = bad_priorities[i];
    ST(rkv_insert_ex(c, 0, toks, s, 4, &o, &existing), RKV_INVALID_ARGUMENT);
    CHECK_MSG("rkv_insert_ex: opts->priority ");
    CHECK_MSG("out of range (expected -2147483648 to 2147483647)");
    if (i == 0) printf("message: %s\n", rkv_last_error_message());
    ST(rkv_insert_lock_ex(c, 0, toks, s, 4, &o, &existing, &l), RKV_INVALID_ARGUMENT);
    CHECK_MSG("rkv_insert_lock_ex: opts->priority");
    ST(rkv_insert_runs_ex(c, 0, toks, 4, runs, 4, &o, &existing), RKV_INVALID_ARGUMENT);
    CHECK_MSG("rkv_insert_runs_ex: opts->priority");
    ST(rkv_insert_lock_runs_ex(c, 0, toks, 4, runs, 4, &o, &existing, &l),
       RKV_INVALID_ARGUMENT);
    CHECK_MSG("rkv_insert_lock_runs_ex: opts->priority");
  }
  CHECK_MSG("opts->priority -9223372036854775808 out of range");
  /* A wrong size, a nonzero reserved field. */
  o = rkv_insert_options_default();
  o.size = 16;
  ST(rkv_insert_ex(c, 0, toks, s, 4, &o, &existing), RKV_INVALID_ARGUMENT);
  CHECK_MSG("rkv_insert_ex: opts->size = 16 is not the size of an rkv_insert_options");
  o = rkv_insert_options_default();
  o.reserved = 1;
  ST(rkv_insert_lock_runs_ex(c, 0, toks, 4, runs, 4, &o, &existing, &l), RKV_INVALID_ARGUMENT);
  CHECK_MSG("rkv_insert_lock_runs_ex: opts->reserved = 1 must be 0");
  /* Nothing was written, cached, adopted or freed: the slots are still the caller's. */
  CHECK(existing == SENTINEL_LEN && l == SENTINEL_LOCK);
  st = stats(c);
  CHECK(st.cached_tokens == 0 && st.free_slots == 60);

  /* NULL opts are the defaults; the edges of int32_t are accepted. */
  ST(rkv_insert_ex(c, 0, toks, s, 2, NULL, &existing), RKV_OK);
  CHECK(existing == 0 && rkv_last_error_message()[0] == '\0');
  o = rkv_insert_options_default();
  o.priority = INT32_MIN;
  ST(rkv_insert_runs_ex(c, 0, toks, 3, runs, 3, &o, &existing), RKV_OK);
  CHECK(existing == 2);
  o.priority = INT32_MAX;
  ST(rkv_insert_lock_runs_ex(c, 0, toks, 4, runs, 4, &o, &existing, &l), RKV_OK);
  CHECK(existing == 3 && l != SENTINEL_LOCK);
  ST(rkv_release(c, l), RKV_OK);
  ST(rkv_insert_lock_ex(c, 0, toks, s, 4, NULL, &existing, &l), RKV_OK);
  CHECK(existing == 4);
  ST(rkv_release(c, l), RKV_OK);
  st = stats(c);
  CHECK(st.cached_tokens == 4 && st.free_slots == 60 && st.protected_tokens == 0);
  rkv_cache_free(c);
}

static void test_policy_orders(void) {
  rkv_cache *c;
  order_log k;
  size_t n;

  /* LRU (the reference): the least recently touched goes first. */
  c = make_policy(RKV_EVICT_LRU, 0, RKV_DEFAULT_SLRU_THRESHOLD);
  put(c, 1, 0); put(c, 2, 0); put(c, 3, 0);
  touch(c, 1);
  CHECK(evict_one(c) == 2 && evict_one(c) == 3 && evict_one(c) == 1);
  rkv_cache_free(c);

  /* PRIORITY: the lowest priority first whatever the age; LRU within a priority. */
  c = make_policy(RKV_EVICT_PRIORITY, 0, RKV_DEFAULT_SLRU_THRESHOLD);
  put(c, 1, 10); put(c, 2, -1); put(c, 3, 0); put(c, 4, 0); put(c, 5, 10);
  touch(c, 3);
  CHECK(evict_one(c) == 2);   /* -1 */
  CHECK(evict_one(c) == 4);   /* 0, least recently touched */
  CHECK(evict_one(c) == 3);   /* 0 */
  CHECK(evict_one(c) == 1);   /* 10, older than 5 */
  CHECK(evict_one(c) == 5);
  /* An insert raises the priority of the path it passes (the max of both). */
  put(c, 1, 0); put(c, 2, 7);
  put(c, 1, 9); /* all cached already: only raises 1 to 9 */
  put(c, 2, 3); /* does not lower 2 below 7 */
  CHECK(evict_one(c) == 2 && evict_one(c) == 1);
  /* A locked insert carries its priority too. */
  {
    const uint32_t toks[2] = {6, 7};
    const uint32_t slots[2] = {60, 61};
    rkv_insert_options o = rkv_insert_options_default();
    rkv_lock l = 0;
    size_t e = 0;
    o.priority = 100;
    ST(rkv_insert_lock_ex(c, 0, toks, slots, 2, &o, &e, &l), RKV_OK);
    put(c, 3, 50);
    memset(&k, 0, sizeof k);
    n = 0;
    ST(rkv_evict(c, 100, log_slots, &k, &n), RKV_OK); /* 6 is pinned */
    CHECK(n == 2 && k.got[0] == 30);
    ST(rkv_release(c, l), RKV_OK);
    put(c, 3, 50);
    CHECK(evict_one(c) == 3 && evict_one(c) == 6);
  }
  rkv_cache_free(c);

  /* MRU: the most recently touched first. */
  c = make_policy(RKV_EVICT_MRU, 0, RKV_DEFAULT_SLRU_THRESHOLD);
  put(c, 1, 0); put(c, 2, 0); put(c, 3, 0);
  touch(c, 1);
  CHECK(evict_one(c) == 1 && evict_one(c) == 3 && evict_one(c) == 2);
  rkv_cache_free(c);

  /* FIFO: the oldest inserted first, touches ignored; FILO: the newest first. */
  c = make_policy(RKV_EVICT_FIFO, 0, RKV_DEFAULT_SLRU_THRESHOLD);
  put(c, 1, 0); put(c, 2, 0); put(c, 3, 0);
  touch(c, 1);
  CHECK(evict_one(c) == 1 && evict_one(c) == 2 && evict_one(c) == 3);
  rkv_cache_free(c);
  c = make_policy(RKV_EVICT_FILO, 0, RKV_DEFAULT_SLRU_THRESHOLD);
  put(c, 1, 0); put(c, 2, 0); put(c, 3, 0);
  touch(c, 1); /* would go first under MRU */
  CHECK(evict_one(c) == 3 && evict_one(c) == 2 && evict_one(c) == 1);
  rkv_cache_free(c);

  /* LFU: the fewest hits first (a hit is an insert through the node; matches count
     none), least recently touched within a count. */
  c = make_policy(RKV_EVICT_LFU, 0, RKV_DEFAULT_SLRU_THRESHOLD);
  put(c, 1, 0); put(c, 2, 0);
  put(c, 1, 0); /* 1: two hits */
  put(c, 3, 0);
  touch(c, 2); touch(c, 2); /* matches: no hits */
  CHECK(evict_one(c) == 3 && evict_one(c) == 2 && evict_one(c) == 1);
  /* inserted_len: the same request inserting its prefix again counts no second hit. */
  {
    const uint32_t toks[2] = {1, 2};
    const uint32_t slots[2] = {10, 11};
    rkv_insert_options o = rkv_insert_options_default();
    size_t e = 0;
    put(c, 1, 0);
    o.inserted_len = 2; /* 1 again, as the same request: touched, no hit */
    ST(rkv_insert_ex(c, 0, toks, slots, 2, &o, &e), RKV_OK);
    CHECK(e == 2);
    put(c, 2, 0);
    /* One hit each: LRU between them (without inserted_len, 1 would have two and go last). */
    CHECK(evict_one(c) == 1 && evict_one(c) == 2);
  }
  rkv_cache_free(c);

  /* SLRU: leaves with hits >= threshold are protected; the threshold is the cache's. */
  c = make_policy(RKV_EVICT_SLRU, 0, RKV_DEFAULT_SLRU_THRESHOLD);
  put(c, 1, 0); put(c, 1, 0); put(c, 2, 0); /* 1: 2 hits, protected at threshold 2 */
  CHECK(evict_one(c) == 2 && evict_one(c) == 1);
  rkv_cache_free(c);
  c = make_policy(RKV_EVICT_SLRU, 0, 3);
  put(c, 1, 0); put(c, 1, 0); put(c, 2, 0); /* both probationary at threshold 3: LRU */
  CHECK(evict_one(c) == 1 && evict_one(c) == 2);
  rkv_cache_free(c);

  /* Pool mode: an allocation that is short evicts in the policy's order; runs carry the
     priority. */
  c = make_policy(RKV_EVICT_PRIORITY, 8, RKV_DEFAULT_SLRU_THRESHOLD);
  {
    const uint32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    rkv_slot_run ra[4], rb[4];
    size_t nr = 0, e = 0, m = 0;
    uint32_t two[2];
    rkv_insert_options o = rkv_insert_options_default();
    ST(rkv_alloc_runs(c, 4, ra, 4, &nr), RKV_OK);
    o.priority = 5;
    ST(rkv_insert_runs_ex(c, 0, a, 4, ra, nr, &o, &e), RKV_OK);
    ST(rkv_alloc_runs(c, 4, rb, 4, &nr), RKV_OK);
    o.priority = 1;
    ST(rkv_insert_runs_ex(c, 0, b, 4, rb, nr, &o, &e), RKV_OK);
    touch(c, 5); /* b is the most recent, but of the lower priority */
    CHECK(stats(c).free_slots == 0);
    ST(rkv_alloc(c, 2, two), RKV_OK);
    ST(rkv_match(c, 0, b, 4, NULL, 0, &m), RKV_OK);
    CHECK(m == 0);
    ST(rkv_match(c, 0, a, 4, NULL, 0, &m), RKV_OK);
    CHECK(m == 4);
    ST(rkv_free(c, two, 2), RKV_OK);
    check_quiescent_sums(c);
  }
  rkv_cache_free(c);
}

int main(void) {
  test_policy_numbers_and_names();
  test_insert_ex_refusals();
  test_policy_orders();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
