/*
 * The C ABI contract (C_ABI.md) exercised from C: every status code that the API can
 * produce, NULLs, zero lengths, buffer too small, double release, double free, foreign
 * locks, page sizes 1 and 16, pool mode and caller-managed mode, and the free callback
 * getting every freed slot exactly once. Prints "N passed, M failed"; exits non-zero on
 * any failure.
 *
 * The KV-event functions (rkv_events_*, rkv_publisher_*, rkv_cache_clear) are in
 * tests/c/test_events.c, which produces RKV_IO_ERROR; the eviction policies and
 * rkv_insert_ex in tests/c/test_policies.c.
 *
 * RKV_DEVICE_ERROR comes only from the host tier (rkv_tier_*), which tests/c/test_tier.c
 * exercises; RKV_INTERNAL_ERROR cannot be produced on purpose: it needs a bug (a panic
 * caught at the boundary; the Rust unit tests of src/ffi check that boundary).
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

/* ---- version, status strings, options ------------------------------------------- */

static void test_version_and_strings(void) {
  const char *v = rkv_version();
  int i, j;
  CHECK(v != NULL && strlen(v) > 0 && strchr(v, '.') != NULL);
  CHECK(rkv_abi_version() == 1);
  CHECK(RKV_ABI_VERSION == 1);
  for (i = 0; i <= 9; i++) {
    const char *s = rkv_status_str((rkv_status)i);
    CHECK(s != NULL && strncmp(s, "RKV_", 4) == 0);
    for (j = 0; j < i; j++) CHECK(strcmp(s, rkv_status_str((rkv_status)j)) != 0);
  }
  CHECK(strncmp(rkv_status_str(RKV_OK), "RKV_OK", 6) == 0);
  CHECK(strncmp(rkv_status_str(RKV_DOUBLE_FREE), "RKV_DOUBLE_FREE", 15) == 0);
  CHECK(strcmp(rkv_status_str((rkv_status)42), "unknown status") == 0);
  CHECK(strcmp(rkv_status_str((rkv_status)-1), "unknown status") == 0);
  CHECK(RKV_OK == 0 && RKV_NULL_ARGUMENT == 1 && RKV_INVALID_ARGUMENT == 2 &&
        RKV_INVALID_LOCK == 3 && RKV_BUFFER_TOO_SMALL == 4 && RKV_OUT_OF_SLOTS == 5 &&
        RKV_NO_POOL == 6 && RKV_DOUBLE_FREE == 7 && RKV_DEVICE_ERROR == 8 &&
        RKV_INTERNAL_ERROR == 9);
  CHECK(RKV_EVICT_LRU == 0 && RKV_EVICT_FIFO == 1);
  CHECK(sizeof(rkv_lock) == 8);
}

static void test_lifecycle(void) {
  rkv_options o = rkv_options_default();
  rkv_cache *c = (rkv_cache *)(uintptr_t)0x1234;
  CHECK(o.page_size == 1 && o.eviction_policy == RKV_EVICT_LRU && o.pool_slots == 0);

  ST(rkv_cache_new(NULL, &c), RKV_NULL_ARGUMENT);
  ST(rkv_cache_new(&o, NULL), RKV_NULL_ARGUMENT);
  o.page_size = 0;
  ST(rkv_cache_new(&o, &c), RKV_INVALID_ARGUMENT);
  o = rkv_options_default();
  o.eviction_policy = 7;
  ST(rkv_cache_new(&o, &c), RKV_INVALID_ARGUMENT);
  o = rkv_options_default();
  o.pool_slots = ((uint64_t)1 << 32) + 1;
  ST(rkv_cache_new(&o, &c), RKV_INVALID_ARGUMENT);
  o = rkv_options_default();
  o.page_size = 16;
  o.pool_slots = 100; /* not a multiple of the page size */
  ST(rkv_cache_new(&o, &c), RKV_INVALID_ARGUMENT);
  CHECK(c == (rkv_cache *)(uintptr_t)0x1234); /* untouched on errors */

  o = rkv_options_default();
  o.eviction_policy = RKV_EVICT_FIFO;
  ST(rkv_cache_new(&o, &c), RKV_OK);
  CHECK(c != NULL && c != (rkv_cache *)(uintptr_t)0x1234);
  rkv_cache_free(c);
  rkv_cache_free(NULL); /* no-op */

  /* Every function refuses a NULL cache. */
  {
    size_t n = SENTINEL_LEN;
    rkv_lock l = SENTINEL_LOCK;
    rkv_stats s;
    uint32_t out[4];
    ST(rkv_match(NULL, 0, NULL, 0, NULL, 0, &n), RKV_NULL_ARGUMENT);
    ST(rkv_match_lock(NULL, 0, NULL, 0, NULL, 0, &n, &l), RKV_NULL_ARGUMENT);
    ST(rkv_insert(NULL, 0, NULL, NULL, 0, &n), RKV_NULL_ARGUMENT);
    ST(rkv_insert_lock(NULL, 0, NULL, NULL, 0, &n, &l), RKV_NULL_ARGUMENT);
    ST(rkv_lock_len(NULL, 1, &n), RKV_NULL_ARGUMENT);
    ST(rkv_release(NULL, 1), RKV_NULL_ARGUMENT);
    ST(rkv_evict(NULL, 1, collect, NULL, &n), RKV_NULL_ARGUMENT);
    ST(rkv_alloc(NULL, 1, out), RKV_NULL_ARGUMENT);
    ST(rkv_free(NULL, out, 0), RKV_NULL_ARGUMENT);
    ST(rkv_cache_stats(NULL, &s), RKV_NULL_ARGUMENT);
    ST(rkv_cache_reset(NULL), RKV_NULL_ARGUMENT);
    ST(rkv_reclaim(NULL), RKV_NULL_ARGUMENT);
    CHECK(n == SENTINEL_LEN && l == SENTINEL_LOCK);
  }
}

/* ---- caller-managed mode, page size 1 ------------------------------------------ */

static void test_caller_managed_p1(void) {
  rkv_cache *c = make(1, 0);
  rkv_cache *other = make(1, 0);
  const uint32_t toks[] = {1, 2, 3, 4, 5};
  const uint32_t slots[] = {100, 101, 102, 103};
  uint32_t out[8];
  size_t n, existing, evicted;
  rkv_lock lk, lk2;
  collector *k;
  rkv_stats s;
  int i;

  /* Empty cache; NULL with zero length everywhere it is allowed. */
  n = SENTINEL_LEN;
  ST(rkv_match(c, 0, toks, 5, out, 8, &n), RKV_OK);
  CHECK(n == 0);
  n = SENTINEL_LEN;
  ST(rkv_match(c, 0, NULL, 0, NULL, 0, &n), RKV_OK);
  CHECK(n == 0);
  existing = SENTINEL_LEN;
  ST(rkv_insert(c, 0, NULL, NULL, 0, &existing), RKV_OK);
  CHECK(existing == 0);

  /* Insert and match. */
  ST(rkv_insert(c, 0, toks, slots, 4, &existing), RKV_OK);
  CHECK(existing == 0);
  for (i = 0; i < 8; i++) out[i] = SENTINEL_SLOT;
  ST(rkv_match(c, 0, toks, 5, out, 8, &n), RKV_OK);
  CHECK(n == 4);
  CHECK(out[0] == 100 && out[1] == 101 && out[2] == 102 && out[3] == 103);
  CHECK(out[4] == SENTINEL_SLOT);
  ST(rkv_match(c, 0, toks, 2, out, 8, &n), RKV_OK);
  CHECK(n == 2);

  /* Length only: out_cap 0, out_slots NULL. */
  n = SENTINEL_LEN;
  ST(rkv_match(c, 0, toks, 5, NULL, 0, &n), RKV_OK);
  CHECK(n == 4);

  /* Buffer too small: *out_len is the required length, the buffer untouched. */
  for (i = 0; i < 8; i++) out[i] = SENTINEL_SLOT;
  n = SENTINEL_LEN;
  ST(rkv_match(c, 0, toks, 5, out, 2, &n), RKV_BUFFER_TOO_SMALL);
  CHECK(n == 4);
  CHECK(out[0] == SENTINEL_SLOT && out[1] == SENTINEL_SLOT);

  /* NULLs where required; outputs untouched. */
  n = SENTINEL_LEN;
  ST(rkv_match(c, 0, NULL, 5, out, 8, &n), RKV_NULL_ARGUMENT);
  ST(rkv_match(c, 0, toks, 5, NULL, 8, &n), RKV_NULL_ARGUMENT);
  CHECK(n == SENTINEL_LEN);
  ST(rkv_match(c, 0, toks, 5, out, 8, NULL), RKV_NULL_ARGUMENT);
  existing = SENTINEL_LEN;
  ST(rkv_insert(c, 0, NULL, slots, 4, &existing), RKV_NULL_ARGUMENT);
  ST(rkv_insert(c, 0, toks, NULL, 4, &existing), RKV_NULL_ARGUMENT);
  ST(rkv_insert(c, 0, toks, slots, 4, NULL), RKV_NULL_ARGUMENT);
  CHECK(existing == SENTINEL_LEN);

  /* A misaligned pointer is refused, not dereferenced. */
  {
    uint32_t buf[4] = {1, 2, 3, 4};
    const uint32_t *odd = (const uint32_t *)(const void *)((const char *)buf + 1);
    ST(rkv_match(c, 0, odd, 2, out, 8, &n), RKV_INVALID_ARGUMENT);
  }

  /* Namespaces never match each other. */
  ST(rkv_match(c, 7, toks, 5, out, 8, &n), RKV_OK);
  CHECK(n == 0);

  /* Insert over an existing prefix: the cached slots win. */
  {
    const uint32_t t2[] = {1, 2, 9};
    const uint32_t s2[] = {200, 201, 202};
    ST(rkv_insert(c, 0, t2, s2, 3, &existing), RKV_OK);
    CHECK(existing == 2);
    ST(rkv_match(c, 0, t2, 3, out, 8, &n), RKV_OK);
    CHECK(n == 3 && out[0] == 100 && out[1] == 101 && out[2] == 202);
  }
  s = stats(c);
  CHECK(s.cached_tokens == 5 && s.evictable_tokens == 5 && s.protected_tokens == 0);
  CHECK(s.inserted_tokens == 5 && s.pool_slots == 0 && s.free_slots == 0);
  CHECK(s.match_calls >= 5 && s.match_hit_tokens >= 4);

  /* match_lock: a lock pins; lock_len; release once; double release. */
  lk = SENTINEL_LOCK;
  ST(rkv_match_lock(c, 0, toks, 5, out, 8, &n, &lk), RKV_OK);
  CHECK(n == 4 && lk != 0 && lk != SENTINEL_LOCK && out[3] == 103);
  n = SENTINEL_LEN;
  ST(rkv_lock_len(c, lk, &n), RKV_OK);
  CHECK(n == 4);
  ST(rkv_lock_len(c, lk, NULL), RKV_NULL_ARGUMENT);
  s = stats(c);
  CHECK(s.protected_tokens == 4 && s.evictable_tokens == 1);

  /* A pinned prefix survives eviction of everything. */
  k = new_collector();
  ST(rkv_evict(c, SIZE_MAX, collect, k, &evicted), RKV_OK);
  CHECK(evicted == 1 && k->total == 1 && k->seen[202] == 1);
  ST(rkv_match(c, 0, toks, 5, out, 8, &n), RKV_OK);
  CHECK(n == 4 && out[0] == 100 && out[3] == 103);
  free(k);

  /* Foreign lock: another cache refuses it, this one still takes it. */
  ST(rkv_release(other, lk), RKV_INVALID_LOCK);
  ST(rkv_lock_len(other, lk, &n), RKV_INVALID_LOCK);
  ST(rkv_release(c, lk), RKV_OK);
  ST(rkv_release(c, lk), RKV_INVALID_LOCK); /* double release */
  ST(rkv_lock_len(c, lk, &n), RKV_INVALID_LOCK);
  ST(rkv_release(c, 0), RKV_INVALID_LOCK);
  ST(rkv_release(c, 0x123456789abcdefull), RKV_INVALID_LOCK);
  ST(rkv_release(c, UINT64_MAX), RKV_INVALID_LOCK);
  s = stats(c);
  CHECK(s.protected_tokens == 0 && s.evictable_tokens == 4);

  /* match_lock with a too small buffer pins nothing and yields no lock. */
  lk = SENTINEL_LOCK;
  n = SENTINEL_LEN;
  ST(rkv_match_lock(c, 0, toks, 5, out, 3, &n, &lk), RKV_BUFFER_TOO_SMALL);
  CHECK(n == 4 && lk == SENTINEL_LOCK);
  ST(rkv_match_lock(c, 0, toks, 5, NULL, 0, &n, &lk), RKV_BUFFER_TOO_SMALL);
  CHECK(n == 4 && lk == SENTINEL_LOCK);
  CHECK(stats(c).protected_tokens == 0);
  ST(rkv_match_lock(c, 0, toks, 5, out, 8, &n, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_match_lock(c, 0, toks, 5, out, 8, NULL, &lk), RKV_NULL_ARGUMENT);
  ST(rkv_match_lock(c, 0, NULL, 5, out, 8, &n, &lk), RKV_NULL_ARGUMENT);
  ST(rkv_match_lock(c, 0, toks, 5, NULL, 8, &n, &lk), RKV_NULL_ARGUMENT);
  CHECK(lk == SENTINEL_LOCK && stats(c).protected_tokens == 0);

  /* A lock on an empty match is still a lock (NULL buffer allowed with cap 0). */
  ST(rkv_match_lock(c, 3, toks, 5, NULL, 0, &n, &lk), RKV_OK);
  CHECK(n == 0 && lk != 0 && lk != SENTINEL_LOCK);
  ST(rkv_lock_len(c, lk, &n), RKV_OK);
  CHECK(n == 0);
  ST(rkv_match_lock(c, 0, toks, 5, out, 5, &n, &lk2), RKV_OK);
  CHECK(n == 4 && lk2 != lk);
  ST(rkv_release(c, lk), RKV_OK);
  ST(rkv_release(c, lk), RKV_INVALID_LOCK);

  /* Reset keeps what is pinned (and the lock valid), drops the rest. */
  {
    const uint32_t t3[] = {50, 51, 52};
    const uint32_t s3[] = {300, 301, 302};
    ST(rkv_insert(c, 0, t3, s3, 3, &existing), RKV_OK);
    CHECK(existing == 0);
  }
  ST(rkv_cache_reset(c), RKV_OK);
  s = stats(c);
  CHECK(s.cached_tokens == 4 && s.protected_tokens == 4);
  ST(rkv_release(c, lk2), RKV_OK);
  ST(rkv_cache_reset(c), RKV_OK);
  s = stats(c);
  CHECK(s.cached_tokens == 0 && s.nodes == 0);
  /* reclaim frees unlinked memory only: what is cached and the counters stay as they are. */
  ST(rkv_reclaim(c), RKV_OK);
  {
    rkv_stats s2 = stats(c);
    CHECK(s2.cached_tokens == 0 && s2.nodes == 0 && s2.evicted_tokens == s.evicted_tokens);
  }

  /* No pool: the pool calls say so; evict needs a callback. */
  ST(rkv_alloc(c, 4, out), RKV_NO_POOL);
  ST(rkv_alloc(c, 0, NULL), RKV_NO_POOL);
  ST(rkv_free(c, slots, 2), RKV_NO_POOL);
  ST(rkv_evict(c, 1, NULL, NULL, &evicted), RKV_NULL_ARGUMENT);
  ST(rkv_evict(c, 1, collect, NULL, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_cache_stats(c, NULL), RKV_NULL_ARGUMENT);

  /* insert_lock. */
  lk = SENTINEL_LOCK;
  ST(rkv_insert_lock(c, 0, toks, slots, 4, &existing, &lk), RKV_OK);
  CHECK(existing == 0 && lk != 0 && lk != SENTINEL_LOCK);
  ST(rkv_lock_len(c, lk, &n), RKV_OK);
  CHECK(n == 4);
  CHECK(stats(c).protected_tokens == 4);
  ST(rkv_insert_lock(c, 0, toks, slots, 4, &existing, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_insert_lock(c, 0, toks, slots, 4, NULL, &lk2), RKV_NULL_ARGUMENT);
  ST(rkv_insert_lock(c, 0, NULL, NULL, 0, &existing, &lk2), RKV_OK);
  CHECK(existing == 0);
  ST(rkv_release(c, lk2), RKV_OK);
  ST(rkv_release(c, lk), RKV_OK);
  check_quiescent_sums(c);

  /* Evict everything: the callback gets each slot once. */
  k = new_collector();
  ST(rkv_evict(c, SIZE_MAX, collect, k, &evicted), RKV_OK);
  CHECK(evicted == 4 && k->total == 4 && each_at_most_once(k));
  CHECK(k->seen[100] == 1 && k->seen[101] == 1 && k->seen[102] == 1 && k->seen[103] == 1);
  CHECK(stats(c).cached_tokens == 0 && stats(c).evicted_tokens >= 5);
  /* Nothing left: evicting more is fine and frees nothing. */
  k->total = 0;
  ST(rkv_evict(c, 10, collect, k, &evicted), RKV_OK);
  CHECK(evicted == 0 && k->total == 0);
  /* rkv_evict_runs: the same slots as runs (100..103 is one run), and the same errors. */
  ST(rkv_insert(c, 0, toks, slots, 4, &existing), RKV_OK);
  ST(rkv_evict_runs(c, 1, NULL, NULL, &evicted), RKV_NULL_ARGUMENT);
  ST(rkv_evict_runs(c, 1, collect_runs, k, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_evict_runs(NULL, 1, collect_runs, k, &evicted), RKV_NULL_ARGUMENT);
  CHECK(stats(c).cached_tokens == 4);
  memset(k, 0, sizeof *k);
  ST(rkv_evict_runs(c, SIZE_MAX, collect_runs, k, &evicted), RKV_OK);
  CHECK(evicted == 4 && k->total == 4 && k->runs == 1 && each_at_most_once(k));
  CHECK(k->seen[100] == 1 && k->seen[103] == 1 && stats(c).cached_tokens == 0);
  k->total = 0;
  ST(rkv_evict_runs(c, 10, collect_runs, k, &evicted), RKV_OK);
  CHECK(evicted == 0 && k->total == 0);
  free(k);

  /* Freeing a cache with a lock outstanding releases it (valgrind checks the rest). */
  ST(rkv_insert_lock(c, 0, toks, slots, 4, &existing, &lk), RKV_OK);
  rkv_cache_free(c);
  rkv_cache_free(other);
}

/* ---- matches returning slot runs (an extension of version 1) -------------------- */

static void test_match_runs(void) {
  rkv_cache *c = make(1, 0);
  uint32_t toks[6] = {1, 2, 3, 4, 5, 6}, q[6] = {1, 2, 3, 4, 5, 99};
  uint32_t slots[6] = {100, 101, 102, 103, 200, 201};
  rkv_slot_run runs[8];
  size_t n_runs = SENTINEL_LEN, len = SENTINEL_LEN, existing;
  rkv_lock lk = SENTINEL_LOCK;
  int i;
  for (i = 0; i < 8; i++) runs[i].start = runs[i].len = SENTINEL_SLOT;
  ST(rkv_insert(c, 0, toks, slots, 6, &existing), RKV_OK);
  /* Bad arguments: a status, and no output written. */
  ST(rkv_match_runs(NULL, 0, toks, 6, runs, 8, &n_runs, &len), RKV_NULL_ARGUMENT);
  ST(rkv_match_runs(c, 0, toks, 6, runs, 8, NULL, &len), RKV_NULL_ARGUMENT);
  ST(rkv_match_runs(c, 0, toks, 6, runs, 8, &n_runs, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_match_runs(c, 0, toks, 6, NULL, 8, &n_runs, &len), RKV_NULL_ARGUMENT);
  ST(rkv_match_runs(c, 0, NULL, 6, runs, 8, &n_runs, &len), RKV_NULL_ARGUMENT);
  ST(rkv_match_lock_runs(c, 0, toks, 6, runs, 8, &n_runs, &len, NULL), RKV_NULL_ARGUMENT);
  CHECK(n_runs == SENTINEL_LEN && len == SENTINEL_LEN && runs[0].start == SENTINEL_SLOT);
  /* Counts only. */
  ST(rkv_match_runs(c, 0, toks, 6, NULL, 0, &n_runs, &len), RKV_OK);
  CHECK(n_runs == 2 && len == 6);
  /* Too small: both counts, no runs. */
  n_runs = len = SENTINEL_LEN;
  ST(rkv_match_runs(c, 0, toks, 6, runs, 1, &n_runs, &len), RKV_BUFFER_TOO_SMALL);
  CHECK(n_runs == 2 && len == 6 && runs[0].start == SENTINEL_SLOT);
  /* The two runs, and a match ending inside the second. */
  ST(rkv_match_runs(c, 0, toks, 6, runs, 8, &n_runs, &len), RKV_OK);
  CHECK(n_runs == 2 && len == 6);
  CHECK(runs[0].start == 100 && runs[0].len == 4 && runs[1].start == 200 && runs[1].len == 2);
  CHECK(runs[2].start == SENTINEL_SLOT);
  ST(rkv_match_runs(c, 0, q, 6, runs, 8, &n_runs, &len), RKV_OK);
  CHECK(n_runs == 2 && len == 5 && runs[1].start == 200 && runs[1].len == 1);
  ST(rkv_match_runs(c, 7, toks, 6, runs, 8, &n_runs, &len), RKV_OK); /* another namespace */
  CHECK(n_runs == 0 && len == 0);
  /* Locking: too small pins nothing; otherwise the match is pinned until released. */
  n_runs = len = SENTINEL_LEN;
  ST(rkv_match_lock_runs(c, 0, toks, 6, runs, 1, &n_runs, &len, &lk), RKV_BUFFER_TOO_SMALL);
  CHECK(n_runs == 2 && len == 6 && lk == SENTINEL_LOCK && stats(c).protected_tokens == 0);
  ST(rkv_match_lock_runs(c, 0, q, 6, runs, 8, &n_runs, &len, &lk), RKV_OK);
  CHECK(n_runs == 2 && len == 5 && lk != SENTINEL_LOCK);
  CHECK(runs[0].start == 100 && runs[0].len == 4 && runs[1].start == 200 && runs[1].len == 1);
  CHECK(stats(c).protected_tokens == 5);
  check_quiescent_sums(c);
  ST(rkv_lock_len(c, lk, &len), RKV_OK);
  CHECK(len == 5);
  ST(rkv_release(c, lk), RKV_OK);
  CHECK(stats(c).protected_tokens == 0);
  rkv_cache_free(c);
}

/* ---- the engine cycle by runs: alloc_runs, insert_runs, free_runs (extensions) ---- */

static size_t expand(const rkv_slot_run *runs, size_t n_runs, uint32_t *out) {
  size_t i, k = 0;
  uint32_t j;
  for (i = 0; i < n_runs; i++)
    for (j = 0; j < runs[i].len; j++) out[k++] = runs[i].start + j;
  return k;
}

static void test_runs_cycle(void) {
  enum { N = 64, P = 4 };
  rkv_cache *c = make(P, N), *no_pool = make(1, 0);
  uint32_t toks[24], all[N], got[N];
  rkv_slot_run runs[N], a[N], bad[3];
  size_t n_runs = SENTINEL_LEN, n, len, existing = SENTINEL_LEN;
  rkv_lock lk = SENTINEL_LOCK;
  rkv_stats s;
  int i;
  for (i = 0; i < 24; i++) toks[i] = (uint32_t)(700 + i);
  for (i = 0; i < N; i++) runs[i].start = runs[i].len = SENTINEL_SLOT;

  /* alloc_runs: bad arguments are refused with nothing written or allocated. */
  ST(rkv_alloc_runs(NULL, 8, runs, N, &n_runs), RKV_NULL_ARGUMENT);
  ST(rkv_alloc_runs(c, 8, runs, N, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_alloc_runs(c, 8, NULL, 4, &n_runs), RKV_NULL_ARGUMENT);
  ST(rkv_alloc_runs(c, 6, runs, N, &n_runs), RKV_INVALID_ARGUMENT); /* not whole pages */
  ST(rkv_alloc_runs(c, N + P, runs, N, &n_runs), RKV_OUT_OF_SLOTS);
  ST(rkv_alloc_runs(no_pool, 4, runs, N, &n_runs), RKV_NO_POOL);
  CHECK(n_runs == SENTINEL_LEN && runs[0].start == SENTINEL_SLOT && stats(c).free_slots == N);
  ST(rkv_alloc_runs(c, 0, NULL, 0, &n_runs), RKV_OK);
  CHECK(n_runs == 0);
  /* A fresh pool hands out one run: too small a buffer gives the slots back and says so. */
  ST(rkv_alloc_runs(c, 16, NULL, 0, &n_runs), RKV_BUFFER_TOO_SMALL);
  CHECK(n_runs == 1 && stats(c).free_slots == N);
  ST(rkv_alloc_runs(c, 24, a, N, &n_runs), RKV_OK);
  CHECK(n_runs >= 1 && expand(a, n_runs, all) == 24 && stats(c).free_slots == N - 24);
  for (i = 0; i < 24; i++) CHECK(all[i] < N);

  /* insert_runs: bad runs are refused whole. */
  bad[0].start = all[0];
  bad[0].len = 4;
  bad[1].start = all[4];
  bad[1].len = 0; /* empty */
  ST(rkv_insert_runs(c, 0, toks, 4, bad, 2, &existing), RKV_INVALID_ARGUMENT);
  ST(rkv_insert_runs(c, 0, toks, 8, bad, 1, &existing), RKV_INVALID_ARGUMENT); /* 4 != 8 */
  bad[0].start = N;
  ST(rkv_insert_runs(c, 0, toks, 4, bad, 1, &existing), RKV_INVALID_ARGUMENT); /* outside */
  ST(rkv_insert_runs(c, 0, toks, 4, NULL, 1, &existing), RKV_NULL_ARGUMENT);
  ST(rkv_insert_runs(c, 0, toks, 4, a, 1, NULL), RKV_NULL_ARGUMENT);
  CHECK(existing == SENTINEL_LEN && stats(c).cached_tokens == 0 && stats(c).free_slots == N - 24);

  /* A request of 16 tokens: adopt 16 slots; 8 stay ours. */
  {
    rkv_slot_run first[N];
    size_t k = 0, left = 16;
    for (i = 0; left > 0; i++) {
      first[k] = a[i];
      if (first[k].len > left) first[k].len = (uint32_t)left;
      left -= first[k].len;
      k++;
    }
    ST(rkv_insert_runs(c, 0, toks, 16, first, k, &existing), RKV_OK);
    CHECK(existing == 0);
  }
  s = stats(c);
  CHECK(s.cached_tokens == 16 && s.free_slots == N - 24);
  /* The next request pins the 16 by runs, then inserts 22 tokens (20 whole pages' worth,
     2 unaligned) with the pinned runs plus its own 8 slots: the tail goes back. */
  ST(rkv_match_lock_runs(c, 0, toks, 22, runs, N, &n, &len, &lk), RKV_OK);
  CHECK(len == 16 && expand(runs, n, got) == 16);
  for (i = 0; i < 16; i++) CHECK(got[i] == all[i]);
  {
    rkv_slot_run mine[N];
    size_t k = 0;
    for (i = 0; i < (int)n; i++) mine[k++] = runs[i];
    /* our 8 slots all[16..24] as one-slot runs, 6 of them for tokens 16..22 */
    for (i = 16; i < 22; i++) {
      mine[k].start = all[i];
      mine[k].len = 1;
      k++;
    }
    ST(rkv_insert_lock_runs(c, 0, toks, 22, mine, k, &existing, NULL), RKV_NULL_ARGUMENT);
    ST(rkv_insert_runs(c, 0, toks, 22, mine, k, &existing), RKV_OK);
    CHECK(existing == 16);
  }
  ST(rkv_release(c, lk), RKV_OK);
  s = stats(c);
  /* cached 20; all[20..22] (the unaligned tail) freed by the insert; all[22..24] ours. */
  CHECK(s.cached_tokens == 20 && s.free_slots == N - 22);
  check_quiescent_sums(c);

  /* free_runs: refused whole (double free, outside, empty run); then back to the pool. */
  bad[0].start = all[22];
  bad[0].len = 2;
  bad[1].start = all[20];
  bad[1].len = 1; /* free already */
  ST(rkv_free_runs(c, bad, 2), RKV_DOUBLE_FREE);
  bad[1].start = all[0]; /* cached by the tree */
  ST(rkv_free_runs(c, bad, 2), RKV_DOUBLE_FREE);
  bad[1].start = N + 5;
  ST(rkv_free_runs(c, bad, 2), RKV_INVALID_ARGUMENT);
  bad[1].start = all[22];
  bad[1].len = 0;
  ST(rkv_free_runs(c, bad, 2), RKV_INVALID_ARGUMENT);
  ST(rkv_free_runs(c, NULL, 1), RKV_NULL_ARGUMENT);
  ST(rkv_free_runs(no_pool, bad, 1), RKV_NO_POOL);
  CHECK(stats(c).free_slots == N - 22);
  ST(rkv_free_runs(c, NULL, 0), RKV_OK);
  ST(rkv_free_runs(c, bad, 1), RKV_OK);
  CHECK(stats(c).free_slots == N - 20);

  /* insert_lock_runs pins what it inserted; caller-managed mode indexes runs as given. */
  ST(rkv_alloc_runs(c, 8, a, N, &n_runs), RKV_OK);
  ST(rkv_insert_lock_runs(c, 3, toks, 8, a, n_runs, &existing, &lk), RKV_OK);
  CHECK(existing == 0 && stats(c).protected_tokens == 8);
  ST(rkv_release(c, lk), RKV_OK);
  bad[0].start = 40;
  bad[0].len = 2;
  bad[1].start = 9;
  bad[1].len = 1;
  ST(rkv_insert_runs(no_pool, 0, toks, 3, bad, 2, &existing), RKV_OK);
  ST(rkv_match(no_pool, 0, toks, 3, got, N, &len), RKV_OK);
  CHECK(len == 3 && got[0] == 40 && got[1] == 41 && got[2] == 9);
  check_quiescent_sums(c);
  rkv_cache_free(c);
  rkv_cache_free(no_pool);
}

/* ---- caller-managed mode, page size 16 ------------------------------------------ */

static void test_caller_managed_p16(void) {
  rkv_cache *c = make(16, 0);
  uint32_t toks[64], slots[64], out[64];
  size_t n, existing, evicted;
  collector *k;
  rkv_stats s;
  int i;
  for (i = 0; i < 64; i++) {
    toks[i] = (uint32_t)(1000 + i);
    slots[i] = (uint32_t)(2000 + i);
  }
  /* 40 tokens: only the 32 of two whole pages are cached. */
  ST(rkv_insert(c, 0, toks, slots, 40, &existing), RKV_OK);
  CHECK(existing == 0);
  s = stats(c);
  CHECK(s.cached_tokens == 32 && s.inserted_tokens == 32);
  ST(rkv_match(c, 0, toks, 64, out, 64, &n), RKV_OK);
  CHECK(n == 32 && out[0] == 2000 && out[31] == 2031);
  ST(rkv_match(c, 0, toks, 31, out, 64, &n), RKV_OK);
  CHECK(n == 16 && out[15] == 2015);
  ST(rkv_match(c, 0, toks, 15, out, 64, &n), RKV_OK);
  CHECK(n == 0);
  ST(rkv_match(c, 0, toks, 64, out, 16, &n), RKV_BUFFER_TOO_SMALL);
  CHECK(n == 32);
  /* A second sequence forking inside the second page: a different page. */
  {
    uint32_t t2[48], s2[48];
    memcpy(t2, toks, sizeof t2);
    for (i = 0; i < 48; i++) s2[i] = (uint32_t)(3000 + i);
    t2[20] = 7; /* differs inside page 1 */
    ST(rkv_insert(c, 0, t2, s2, 48, &existing), RKV_OK);
    CHECK(existing == 16);
    ST(rkv_match(c, 0, t2, 48, out, 64, &n), RKV_OK);
    CHECK(n == 48 && out[0] == 2000 && out[15] == 2015 && out[16] == 3016 &&
          out[47] == 3047);
  }
  /* Same tokens in another namespace (other slots: a slot is cached once). */
  for (i = 0; i < 16; i++) slots[i] = (uint32_t)(4000 + i);
  ST(rkv_insert(c, 9, toks, slots, 16, &existing), RKV_OK);
  CHECK(existing == 0);
  s = stats(c);
  CHECK(s.cached_tokens == 32 + 32 + 16);
  check_quiescent_sums(c);

  /* Evict a little: whole pages, each slot once. */
  k = new_collector();
  ST(rkv_evict(c, 1, collect, k, &evicted), RKV_OK);
  CHECK(evicted >= 16 && evicted % 16 == 0 && k->total == evicted && each_at_most_once(k));
  ST(rkv_evict(c, SIZE_MAX, collect, k, &evicted), RKV_OK);
  CHECK(k->total == 80 && each_at_most_once(k));
  for (i = 0; i < 32; i++) CHECK(k->seen[2000 + i] == 1);
  for (i = 16; i < 48; i++) CHECK(k->seen[3000 + i] == 1);
  for (i = 0; i < 16; i++) CHECK(k->seen[4000 + i] == 1);
  CHECK(stats(c).cached_tokens == 0);
  free(k);
  rkv_cache_free(c);
}

/* ---- pool mode ------------------------------------------------------------------ */

static void test_pool_p1(void) {
  enum { N = 64 };
  rkv_cache *c = make(1, N);
  uint32_t a[N + 1], b[8], out[N];
  uint32_t toks[N];
  size_t n, existing, evicted;
  rkv_lock lk;
  collector *k;
  rkv_stats s;
  int i, j;
  for (i = 0; i < N; i++) toks[i] = (uint32_t)(500 + i);

  s = stats(c);
  CHECK(s.pool_slots == N && s.free_slots == N && s.cached_tokens == 0);

  /* alloc: distinct slots in range; all or nothing. */
  ST(rkv_alloc(c, 10, a), RKV_OK);
  for (i = 0; i < 10; i++) {
    CHECK(a[i] < N);
    for (j = 0; j < i; j++) CHECK(a[i] != a[j]);
  }
  CHECK(stats(c).free_slots == N - 10);
  ST(rkv_alloc(c, 0, NULL), RKV_OK);
  ST(rkv_alloc(c, 5, NULL), RKV_NULL_ARGUMENT);
  for (i = 0; i < N + 1; i++) out[i % N] = SENTINEL_SLOT;
  ST(rkv_alloc(c, N - 9, out), RKV_OUT_OF_SLOTS); /* only N - 10 free, nothing evictable */
  CHECK(out[0] == SENTINEL_SLOT && stats(c).free_slots == N - 10);
  ST(rkv_alloc(c, SIZE_MAX, out), RKV_OUT_OF_SLOTS);

  /* free: back to the pool; twice is a double free; outside the pool is invalid. */
  ST(rkv_free(c, a + 5, 5), RKV_OK);
  CHECK(stats(c).free_slots == N - 5);
  ST(rkv_free(c, a + 5, 1), RKV_DOUBLE_FREE);
  {
    uint32_t mixed[2];
    mixed[0] = a[0]; /* allocated: fine alone */
    mixed[1] = a[6]; /* already free */
    ST(rkv_free(c, mixed, 2), RKV_DOUBLE_FREE);
    CHECK(stats(c).free_slots == N - 5); /* refused whole */
    mixed[1] = a[0];
    ST(rkv_free(c, mixed, 2), RKV_DOUBLE_FREE); /* the same slot twice in one call */
    CHECK(stats(c).free_slots == N - 5);
  }
  b[0] = 1000;
  ST(rkv_free(c, b, 1), RKV_INVALID_ARGUMENT);
  ST(rkv_free(c, NULL, 0), RKV_OK);
  ST(rkv_free(c, NULL, 1), RKV_NULL_ARGUMENT);
  CHECK(stats(c).free_slots == N - 5);

  /* insert adopts a[0..5]: the tree now holds them. */
  ST(rkv_insert(c, 0, toks, a, 5, &existing), RKV_OK);
  CHECK(existing == 0);
  s = stats(c);
  CHECK(s.cached_tokens == 5 && s.free_slots == N - 5); /* free + cached + held(0) == N */
  ST(rkv_free(c, a, 1), RKV_DOUBLE_FREE); /* held by the tree */

  /* insert refuses slots outside the pool, free slots, and cached slots at another place. */
  b[0] = 1000;
  ST(rkv_insert(c, 1, toks, b, 1, &existing), RKV_INVALID_ARGUMENT);
  b[0] = a[6]; /* free */
  ST(rkv_insert(c, 1, toks, b, 1, &existing), RKV_INVALID_ARGUMENT);
  b[0] = a[3]; /* cached at position 3 of ns 0 */
  ST(rkv_insert(c, 1, toks, b, 1, &existing), RKV_INVALID_ARGUMENT);
  CHECK(stats(c).cached_tokens == 5 && stats(c).free_slots == N - 5);

  /* A request: match_lock, alloc the rest, insert; the non-adopted slots are freed by it. */
  ST(rkv_match_lock(c, 0, toks, 8, out, N, &n, &lk), RKV_OK);
  CHECK(n == 5);
  ST(rkv_alloc(c, 3, out + 5), RKV_OK);
  ST(rkv_insert(c, 0, toks, out, 8, &existing), RKV_OK);
  CHECK(existing == 5);
  ST(rkv_release(c, lk), RKV_OK);
  s = stats(c);
  CHECK(s.cached_tokens == 8 && s.free_slots == N - 8);
  /* A duplicate insert with fresh slots: nothing adopted, the call frees them. */
  ST(rkv_alloc(c, 8, b), RKV_OK);
  CHECK(stats(c).free_slots == N - 16);
  ST(rkv_insert(c, 0, toks, b, 8, &existing), RKV_OK);
  CHECK(existing == 8);
  s = stats(c);
  CHECK(s.cached_tokens == 8 && s.free_slots == N - 8);

  /* insert_lock with fresh slots in another namespace. */
  ST(rkv_alloc(c, 4, b), RKV_OK);
  ST(rkv_insert_lock(c, 2, toks, b, 4, &existing, &lk), RKV_OK);
  CHECK(existing == 0);
  s = stats(c);
  CHECK(s.cached_tokens == 12 && s.protected_tokens == 4 && s.free_slots == N - 12);

  /* alloc evicts when short (never the pinned ones) ... */
  ST(rkv_alloc(c, N - 4, out), RKV_OK);
  s = stats(c);
  CHECK(s.free_slots == 0 && s.cached_tokens == 4 && s.protected_tokens == 4);
  /* ... and is out of slots when only pinned pages are left. */
  ST(rkv_alloc(c, 1, b + 4), RKV_OUT_OF_SLOTS);
  ST(rkv_free(c, out, N - 4), RKV_OK);
  ST(rkv_release(c, lk), RKV_OK);
  s = stats(c);
  CHECK(s.free_slots == N - 4 && s.cached_tokens == 4);

  /* evict in pool mode: NULL callback allowed; with one, each slot once. */
  ST(rkv_alloc(c, 6, a), RKV_OK);
  ST(rkv_insert(c, 3, toks, a, 6, &existing), RKV_OK);
  ST(rkv_evict(c, 1, NULL, NULL, &evicted), RKV_OK);
  CHECK(evicted >= 1);
  s = stats(c);
  CHECK(s.free_slots + s.cached_tokens == N);
  k = new_collector();
  ST(rkv_evict(c, SIZE_MAX, collect, k, &evicted), RKV_OK);
  CHECK(k->total == evicted && each_at_most_once(k));
  s = stats(c);
  CHECK(s.cached_tokens == 0 && s.free_slots == N);
  free(k);
  /* rkv_evict_runs in pool mode: NULL callback allowed; with one, each slot once; the
     slots go back to the pool either way. */
  ST(rkv_alloc(c, 6, a), RKV_OK);
  ST(rkv_insert(c, 3, toks, a, 6, &existing), RKV_OK);
  ST(rkv_alloc(c, 6, a), RKV_OK);
  ST(rkv_insert(c, 4, toks, a, 6, &existing), RKV_OK);
  ST(rkv_evict_runs(c, 1, NULL, NULL, &evicted), RKV_OK);
  CHECK(evicted == 6); /* one whole leaf */
  s = stats(c);
  CHECK(s.free_slots + s.cached_tokens == N && s.cached_tokens == 6);
  k = new_collector();
  ST(rkv_evict_runs(c, SIZE_MAX, collect_runs, k, &evicted), RKV_OK);
  CHECK(evicted == 6 && k->total == 6 && k->runs >= 1 && each_at_most_once(k));
  s = stats(c);
  CHECK(s.cached_tokens == 0 && s.free_slots == N);
  free(k);

  /* reset returns every unpinned slot to the pool. */
  ST(rkv_alloc(c, 6, a), RKV_OK);
  ST(rkv_insert(c, 0, toks, a, 6, &existing), RKV_OK);
  ST(rkv_cache_reset(c), RKV_OK);
  s = stats(c);
  CHECK(s.cached_tokens == 0 && s.free_slots == N);

  /* Freeing the cache with allocated slots and a lock outstanding leaks nothing. */
  ST(rkv_alloc(c, 3, a), RKV_OK);
  ST(rkv_insert_lock(c, 0, toks, a, 3, &existing, &lk), RKV_OK);
  ST(rkv_alloc(c, 3, a), RKV_OK);
  rkv_cache_free(c);
}

static void test_pool_p16(void) {
  enum { P = 16, N = 128 };
  rkv_cache *c = make(P, N);
  uint32_t a[N], toks[N], out[N];
  size_t n, existing, evicted;
  rkv_stats s;
  collector *k;
  int i;
  for (i = 0; i < N; i++) toks[i] = (uint32_t)(7 * i + 1);

  /* Slots come in whole pages. */
  ST(rkv_alloc(c, 32, a), RKV_OK);
  for (i = 0; i < 32; i += P) {
    int j;
    CHECK(a[i] % P == 0);
    for (j = 1; j < P; j++) CHECK(a[i + j] == a[i] + (uint32_t)j);
  }
  ST(rkv_alloc(c, 10, out), RKV_INVALID_ARGUMENT); /* not whole pages */
  CHECK(stats(c).free_slots == N - 32);

  /* Insert 32 tokens; match the 24-token query down to one page. */
  ST(rkv_insert(c, 0, toks, a, 32, &existing), RKV_OK);
  CHECK(existing == 0);
  ST(rkv_match(c, 0, toks, 24, out, N, &n), RKV_OK);
  CHECK(n == 16 && out[0] == a[0] && out[15] == a[15]);
  s = stats(c);
  CHECK(s.cached_tokens == 32 && s.free_slots == N - 32);

  /* Fill the pool: alloc evicts whole pages. */
  ST(rkv_alloc(c, N, out), RKV_OK);
  s = stats(c);
  CHECK(s.free_slots == 0 && s.cached_tokens == 0);
  ST(rkv_alloc(c, P, a), RKV_OUT_OF_SLOTS);
  ST(rkv_free(c, out, N), RKV_OK);
  ST(rkv_free(c, out, P), RKV_DOUBLE_FREE);
  CHECK(stats(c).free_slots == N);

  ST(rkv_alloc(c, 48, a), RKV_OK);
  ST(rkv_insert(c, 1, toks, a, 48, &existing), RKV_OK);
  k = new_collector();
  ST(rkv_evict(c, 1, collect, k, &evicted), RKV_OK);
  CHECK(evicted >= P && evicted % P == 0 && k->total == evicted && each_at_most_once(k));
  ST(rkv_evict(c, SIZE_MAX, collect, k, &evicted), RKV_OK);
  CHECK(k->total == 48 && each_at_most_once(k));
  for (i = 0; i < 48; i++) CHECK(a[i] < MAX_SLOT && k->seen[a[i]] == 1);
  CHECK(stats(c).free_slots == N);
  free(k);
  rkv_cache_free(c);
}

/* ---- threads -------------------------------------------------------------------- */

typedef struct {
  rkv_cache *cache;
  int id;
  int errors;
} worker_arg;

/* Refused calls change nothing, the tree's shape included (found by an audit): a match_lock
 * whose buffer is too small splits no edge, and a pool-mode insert refused for a bad slot
 * leaves no split and refreshes no access stamp. */
static void test_refusals_keep_the_shape(void) {
  rkv_cache *c = make(1, 0);
  const uint32_t a[4] = {1, 2, 3, 4}, a_slots[4] = {10, 11, 12, 13};
  const uint32_t q[3] = {1, 2, 9};
  uint32_t out[4];
  rkv_slot_run runs[4];
  size_t n = 0, n_runs = 0, existing = 0, evicted = 0;
  rkv_lock lk = SENTINEL_LOCK;
  ST(rkv_insert(c, 0, a, a_slots, 4, &existing), RKV_OK);
  uint64_t nodes = stats(c).nodes;
  ST(rkv_match_lock(c, 0, q, 3, out, 1, &n, &lk), RKV_BUFFER_TOO_SMALL);
  CHECK(n == 2 && lk == SENTINEL_LOCK && stats(c).nodes == nodes);
  ST(rkv_match_lock_runs(c, 0, q, 3, runs, 0, &n_runs, &n, &lk), RKV_BUFFER_TOO_SMALL);
  CHECK(n_runs == 1 && n == 2 && lk == SENTINEL_LOCK && stats(c).nodes == nodes);
  CHECK(stats(c).protected_tokens == 0);
  /* With room, the lock splits the edge where the match ends. */
  ST(rkv_match_lock(c, 0, q, 3, out, 2, &n, &lk), RKV_OK);
  CHECK(n == 2 && out[0] == 10 && out[1] == 11 && stats(c).nodes == nodes + 1);
  ST(rkv_release(c, lk), RKV_OK);
  rkv_cache_free(c);

  c = make(1, 16);
  uint32_t s[12];
  ST(rkv_alloc(c, 12, s), RKV_OK);
  const uint32_t b[4] = {9, 9, 9, 9}, key[4] = {1, 2, 7, 8};
  ST(rkv_insert(c, 0, a, s, 4, &existing), RKV_OK);     /* the older leaf */
  ST(rkv_insert(c, 0, b, s + 4, 4, &existing), RKV_OK); /* the newer */
  rkv_stats before = stats(c);
  lk = SENTINEL_LOCK;
  const uint32_t bad[4] = {s[8], s[9], s[10], 999};
  ST(rkv_insert(c, 0, key, bad, 4, &existing), RKV_INVALID_ARGUMENT);
  ST(rkv_insert_lock(c, 0, key, bad, 4, &existing, &lk), RKV_INVALID_ARGUMENT);
  const uint32_t longer[6] = {1, 2, 3, 4, 5, 6};
  const uint32_t bad_longer[6] = {s[0], s[1], s[2], s[3], s[8], 999};
  ST(rkv_insert(c, 0, longer, bad_longer, 6, &existing), RKV_INVALID_ARGUMENT);
  rkv_stats after = stats(c);
  CHECK(after.nodes == before.nodes && after.cached_tokens == before.cached_tokens);
  CHECK(after.free_slots == before.free_slots && lk == SENTINEL_LOCK);
  /* The older leaf is still evicted first, whole. */
  collector *k = new_collector();
  ST(rkv_evict(c, 1, collect, k, &evicted), RKV_OK);
  CHECK(evicted == 4 && k->total == 4 && k->seen[s[0]] == 1 && k->seen[s[3]] == 1);
  free(k);
  ST(rkv_free(c, s + 8, 4), RKV_OK);
  check_quiescent_sums(c);
  rkv_cache_free(c);
}

static void *worker(void *p) {
  worker_arg *w = (worker_arg *)p;
  uint32_t toks[32], slots[32];
  int round;
  for (round = 0; round < 300; round++) {
    size_t n, existing, len, i;
    rkv_lock lk;
    size_t want = 4 + (size_t)((round * 7 + w->id) % 28);
    for (i = 0; i < want; i++) toks[i] = (uint32_t)((i < 3) ? i : (round % 5) * 100 + i);
    if (rkv_match_lock(w->cache, (uint64_t)(round % 3), toks, want, slots, 32, &n, &lk) !=
        RKV_OK) {
      w->errors++;
      continue;
    }
    if (rkv_alloc(w->cache, want - n, slots + n) == RKV_OK) {
      if (rkv_insert(w->cache, (uint64_t)(round % 3), toks, slots, want, &existing) != RKV_OK)
        w->errors++;
    }
    if (rkv_lock_len(w->cache, lk, &len) != RKV_OK || len != n) w->errors++;
    if (rkv_release(w->cache, lk) != RKV_OK) w->errors++;
    if (rkv_release(w->cache, lk) != RKV_INVALID_LOCK) w->errors++;
    if (round % 50 == 0 && rkv_evict(w->cache, 16, NULL, NULL, &n) != RKV_OK) w->errors++;
  }
  return NULL;
}

static void test_threads(void) {
  enum { T = 4, N = 512 };
  rkv_cache *c = make(1, N);
  pthread_t th[T];
  worker_arg args[T];
  rkv_stats s;
  int i;
  for (i = 0; i < T; i++) {
    args[i].cache = c;
    args[i].id = i;
    args[i].errors = 0;
    CHECK(pthread_create(&th[i], NULL, worker, &args[i]) == 0);
  }
  for (i = 0; i < T; i++) {
    CHECK(pthread_join(th[i], NULL) == 0);
    CHECK(args[i].errors == 0);
  }
  s = stats(c);
  CHECK(s.protected_tokens == 0);
  CHECK(s.cached_tokens == s.evictable_tokens);
  CHECK(s.free_slots + s.cached_tokens == N); /* every slot accounted for */
  rkv_cache_free(c);
}

/* rkv_last_error_message: every failure says what exactly was wrong, on its own thread;
 * a success clears it; it is never NULL. */

static void *message_thread(void *p) {
  const rkv_cache *c = (const rkv_cache *)p;
  int *ok = (int *)malloc(sizeof *ok);
  const char *m = rkv_last_error_message();
  /* Another thread's failure is not this thread's. */
  *ok = m != NULL && m[0] == '\0' && rkv_release(c, 0) == RKV_INVALID_LOCK &&
        strstr(rkv_last_error_message(), "rkv_release: lock 0x0") != NULL;
  return ok;
}

static void test_error_messages(void) {
  rkv_cache *c = make(1, 65536);
  rkv_cache *managed = make(1, 0);
  const uint32_t toks[4] = {1, 2, 3, 4};
  uint32_t s[4], out[4] = {7, 7, 7, 7};
  size_t existing = SENTINEL_LEN, n = SENTINEL_LEN;
  rkv_options bad = rkv_options_default();
  rkv_cache *none = NULL;
  pthread_t th;
  void *res = NULL;

  CHECK(rkv_last_error_message() != NULL);
  ST(rkv_alloc(c, 3, s), RKV_OK);
  CHECK(rkv_last_error_message()[0] == '\0');
  s[3] = 70000;
  ST(rkv_insert(c, 0, toks, s, 4, &existing), RKV_INVALID_ARGUMENT);
  printf("message: %s\n", rkv_last_error_message());
  CHECK_MSG("rkv_insert: slots[3] = 70000 is out of range: the pool has 65536 slots");
  CHECK(existing == SENTINEL_LEN);

  s[3] = s[0];
  ST(rkv_insert(c, 0, toks, s, 4, &existing), RKV_INVALID_ARGUMENT);
  printf("message: %s\n", rkv_last_error_message());
  CHECK_MSG("is given twice (also slots[3]");

  ST(rkv_insert(c, 0, toks, NULL, 4, &existing), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_insert: slots is NULL but n_tokens = 4");
  ST(rkv_match(c, 0, toks, 4, out, 4, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_match: out_len is NULL");

  bad.page_size = 16;
  bad.pool_slots = 100;
  ST(rkv_cache_new(&bad, &none), RKV_INVALID_ARGUMENT);
  printf("message: %s\n", rkv_last_error_message());
  CHECK_MSG("opts->pool_slots = 100 is not a multiple of opts->page_size = 16");
  CHECK(none == NULL);

  ST(rkv_release(c, 12345), RKV_INVALID_LOCK);
  printf("message: %s\n", rkv_last_error_message());
  CHECK_MSG("rkv_release: lock 0x3039");
  ST(rkv_alloc(managed, 1, out), RKV_NO_POOL);
  CHECK_MSG("rkv_alloc: this cache has no slot pool");
  ST(rkv_evict(managed, 1, NULL, NULL, &n), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_evict: free_fn is NULL");
  ST(rkv_alloc(c, 70000, out), RKV_OUT_OF_SLOTS);
  CHECK_MSG("rkv_alloc: n_slots = 70000 is more than the whole pool of 65536 slots");
  CHECK(out[0] == 7 && n == SENTINEL_LEN);

  /* Functions that return no status leave it; the next success clears it. */
  (void)rkv_status_str(RKV_OK);
  (void)rkv_version();
  CHECK_MSG("rkv_alloc: n_slots = 70000");
  CHECK(pthread_create(&th, NULL, message_thread, managed) == 0);
  CHECK(pthread_join(th, &res) == 0);
  CHECK(res != NULL && *(int *)res == 1);
  free(res);
  CHECK_MSG("rkv_alloc: n_slots = 70000"); /* untouched by the other thread */
  ST(rkv_free(c, s, 3), RKV_OK);
  CHECK(rkv_last_error_message()[0] == '\0');
  rkv_cache_free(managed);
  rkv_cache_free(c);
}

/* ---- namespaces: drop one, its counts, the live count (extensions of version 1) ---- */

static rkv_namespace_stats ns_stats(const rkv_cache *c, uint64_t ns) {
  rkv_namespace_stats s;
  memset(&s, 0xA5, sizeof s);
  ST(rkv_cache_namespace_stats(c, ns, &s), RKV_OK);
  return s;
}

static uint64_t ns_count(const rkv_cache *c) {
  uint64_t n = 0xA5A5A5A5u;
  ST(rkv_namespace_count(c, &n), RKV_OK);
  return n;
}

static void test_namespaces(void) {
  rkv_cache *managed = make(1, 0);
  rkv_cache *pooled = make(4, 64);
  const uint32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const uint32_t s1[8] = {100, 101, 102, 103, 104, 105, 106, 107};
  const uint32_t s2[8] = {200, 201, 202, 203, 204, 205, 206, 207};
  uint32_t out[8], ps[8];
  size_t existing = 0, n = SENTINEL_LEN, len = 0;
  uint64_t cnt = 0xA5A5A5A5u;
  rkv_lock lk = 0;
  rkv_namespace_stats ns;
  rkv_stats st;
  collector *k = new_collector();
  int i;

  CHECK(sizeof(rkv_namespace_stats) == 32);
  CHECK(ns_count(managed) == 0);
  ST(rkv_insert(managed, 1, toks, s1, 8, &existing), RKV_OK);
  ST(rkv_insert(managed, 2, toks, s2, 8, &existing), RKV_OK);
  CHECK(ns_count(managed) == 2);
  ns = ns_stats(managed, 1);
  CHECK(ns.cached_tokens == 8 && ns.evictable_tokens == 8 && ns.protected_tokens == 0);
  CHECK(ns.nodes == 1);

  /* Pin 4 tokens of namespace 1; dropping it frees the other 4 and keeps the pinned. */
  ST(rkv_match_lock(managed, 1, toks, 4, out, 8, &len, &lk), RKV_OK);
  CHECK(len == 4 && lk != 0);
  ST(rkv_drop_namespace(managed, 1, collect, k, &n), RKV_OK);
  CHECK(rkv_last_error_message()[0] == '\0');
  CHECK(n == 4 && k->total == 4 && each_at_most_once(k));
  for (i = 4; i < 8; i++) CHECK(k->seen[s1[i]] == 1);
  ns = ns_stats(managed, 1);
  CHECK(ns.cached_tokens == 4 && ns.protected_tokens == 4 && ns.evictable_tokens == 0);
  CHECK(ns_stats(managed, 2).cached_tokens == 8); /* other namespaces untouched */
  CHECK(ns_count(managed) == 2);
  /* Dropping again frees nothing while the pin holds. */
  ST(rkv_drop_namespace(managed, 1, collect, k, &n), RKV_OK);
  CHECK(n == 0 && k->total == 4);
  /* Released, the rest goes and the namespace is reclaimed. */
  ST(rkv_release(managed, lk), RKV_OK);
  ST(rkv_drop_namespace(managed, 1, collect, k, &n), RKV_OK);
  CHECK(n == 4 && k->total == 8 && each_at_most_once(k));
  for (i = 0; i < 8; i++) CHECK(k->seen[s1[i]] == 1);
  ns = ns_stats(managed, 1);
  CHECK(ns.cached_tokens == 0 && ns.evictable_tokens == 0 && ns.protected_tokens == 0);
  CHECK(ns.nodes == 0);
  CHECK(ns_count(managed) == 1);
  st = stats(managed);
  CHECK(st.cached_tokens == 8 && st.evicted_tokens == 8);
  check_quiescent_sums(managed);

  /* An unknown namespace: 0 and RKV_OK, all-zero stats. */
  n = SENTINEL_LEN;
  ST(rkv_drop_namespace(managed, 12345, collect, k, &n), RKV_OK);
  CHECK(n == 0 && k->total == 8);
  ns = ns_stats(managed, UINT64_MAX);
  CHECK(ns.cached_tokens == 0 && ns.evictable_tokens == 0 && ns.protected_tokens == 0);
  CHECK(ns.nodes == 0);

  /* Bad inputs: a status, a message, outputs untouched, nothing dropped. */
  n = SENTINEL_LEN;
  ST(rkv_drop_namespace(managed, 2, NULL, NULL, &n), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_drop_namespace: free_fn is NULL, but this cache has no pool");
  ST(rkv_drop_namespace(managed, 2, collect, k, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_drop_namespace: out_freed is NULL");
  ST(rkv_drop_namespace(NULL, 2, collect, k, &n), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_drop_namespace: cache is NULL");
  CHECK(n == SENTINEL_LEN && k->total == 8 && ns_stats(managed, 2).cached_tokens == 8);
  memset(&ns, 0x5A, sizeof ns);
  ST(rkv_cache_namespace_stats(NULL, 2, &ns), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_cache_namespace_stats: cache is NULL");
  CHECK(ns.cached_tokens == 0x5A5A5A5A5A5A5A5Aull && ns.nodes == 0x5A5A5A5A5A5A5A5Aull);
  ST(rkv_cache_namespace_stats(managed, 2, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_cache_namespace_stats: out_stats is NULL");
  ST(rkv_namespace_count(NULL, &cnt), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_namespace_count: cache is NULL");
  ST(rkv_namespace_count(managed, NULL), RKV_NULL_ARGUMENT);
  CHECK_MSG("rkv_namespace_count: out_count is NULL");
  CHECK(cnt == 0xA5A5A5A5u);

  /* Pool mode: no callback needed, the slots go back to the pool. */
  ST(rkv_alloc(pooled, 8, ps), RKV_OK);
  ST(rkv_insert(pooled, 7, toks, ps, 8, &existing), RKV_OK);
  CHECK(ns_count(pooled) == 1 && stats(pooled).free_slots == 56);
  ST(rkv_drop_namespace(pooled, 7, NULL, NULL, &n), RKV_OK);
  CHECK(n == 8 && ns_count(pooled) == 0 && stats(pooled).free_slots == 64);
  ST(rkv_drop_namespace(pooled, 7, NULL, NULL, &n), RKV_OK);
  CHECK(n == 0);

  free(k);
  rkv_cache_free(pooled);
  rkv_cache_free(managed);
}


int main(void) {
  int i;
  test_version_and_strings();
  test_lifecycle();
  test_caller_managed_p1();
  test_caller_managed_p16();
  test_match_runs();
  test_runs_cycle();
  test_pool_p1();
  test_pool_p16();
  test_refusals_keep_the_shape();
  test_threads();
  test_error_messages();
  test_namespaces();

  for (i = 0; i <= 10; i++) {
    if (!produced[i] && i != RKV_DEVICE_ERROR && i != RKV_INTERNAL_ERROR && i != RKV_IO_ERROR) {
      failed++;
      fprintf(stderr, "status %d (%s) was never produced\n", i, rkv_status_str((rkv_status)i));
    }
  }
  printf("status codes produced: ");
  for (i = 0; i <= 10; i++)
    if (produced[i]) printf("%d ", i);
  printf("(8 RKV_DEVICE_ERROR: test_tier.c; 9 RKV_INTERNAL_ERROR needs a bug; 10 RKV_IO_ERROR: "
         "test_events.c)\n");
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
