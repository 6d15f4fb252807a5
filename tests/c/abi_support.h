/* Shared helpers of the C ABI tests (test_abi.c, test_events.c): the status-code tally
 * (ST records every status a call returned), sentinels, a cache maker, stats, and the
 * free callback's collector. Include after "radixkv.h" and "check.h". */
#ifndef RADIXKV_TESTS_ABI_SUPPORT_H
#define RADIXKV_TESTS_ABI_SUPPORT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Which status codes the run produced (index = code). */
static int produced[16];
static inline rkv_status note(rkv_status s) {
  if ((int)s >= 0 && (int)s < 16) produced[(int)s] = 1;
  return s;
}
#define ST(call, want) CHECK_ST(note(call), want)

#define SENTINEL_LEN ((size_t)0xA5A5A5A5u)
#define SENTINEL_LOCK ((rkv_lock)0xDEADBEEFu)
#define SENTINEL_SLOT 0xFFFFFFFEu

static inline rkv_cache *make(uint32_t page, uint64_t pool) {
  rkv_options o = rkv_options_default();
  rkv_cache *c = NULL;
  o.page_size = page;
  o.pool_slots = pool;
  ST(rkv_cache_new(&o, &c), RKV_OK);
  CHECK(c != NULL);
  return c;
}

static inline rkv_stats stats(const rkv_cache *c) {
  rkv_stats s;
  memset(&s, 0, sizeof s);
  ST(rkv_cache_stats(c, &s), RKV_OK);
  return s;
}

static inline void check_quiescent_sums(const rkv_cache *c) {
  rkv_stats s = stats(c);
  CHECK(s.cached_tokens == s.evictable_tokens + s.protected_tokens);
}

/* ---- the free callback: counts each slot it is given ------------------------------ */

#define MAX_SLOT 8192
typedef struct {
  unsigned seen[MAX_SLOT];
  size_t calls, total, out_of_range, runs;
} collector;

static inline void collect(void *ctx, const uint32_t *slots, size_t n) {
  collector *k = (collector *)ctx;
  size_t i;
  k->calls++;
  for (i = 0; i < n; i++) {
    k->total++;
    if (slots[i] < MAX_SLOT) k->seen[slots[i]]++;
    else k->out_of_range++;
  }
}

/* rkv_evict_runs' callback: counts the slots of each run like collect, and the runs. */
static inline void collect_runs(void *ctx, const rkv_slot_run *runs, size_t n) {
  collector *k = (collector *)ctx;
  size_t i;
  uint32_t j;
  k->calls++;
  for (i = 0; i < n; i++) {
    k->runs++;
    if (runs[i].len == 0) k->out_of_range++; /* runs are never empty */
    for (j = 0; j < runs[i].len; j++) {
      uint32_t s = runs[i].start + j;
      k->total++;
      if (s < MAX_SLOT) k->seen[s]++;
      else k->out_of_range++;
    }
  }
}

static inline collector *new_collector(void) {
  collector *k = (collector *)calloc(1, sizeof *k);
  if (!k) abort();
  return k;
}

/* No slot was reported twice, and none outside [0, MAX_SLOT). */
static inline int each_at_most_once(const collector *k) {
  size_t i;
  if (k->out_of_range) return 0;
  for (i = 0; i < MAX_SLOT; i++)
    if (k->seen[i] > 1) return 0;
  return 1;
}


/* The last error message contains `needle` (says which message it was otherwise). */
#define CHECK_MSG(needle)                                                                \
  do {                                                                                   \
    const char *m_ = rkv_last_error_message();                                           \
    if (m_ != NULL && strstr(m_, (needle)) != NULL) {                                    \
      passed++;                                                                          \
    } else {                                                                             \
      failed++;                                                                          \
      fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__,        \
              m_ ? m_ : "(NULL)", (needle));                                             \
    }                                                                                    \
  } while (0)

#endif
