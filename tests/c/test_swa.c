/*
 * The sliding-window (SWA) component through the C ABI (an extension of version 1): a
 * pool-mode cache made with rkv_policy_options.swa_window, SWA-valid matches, a window
 * lock that keeps its window's SWA KV, rkv_evict_kv's reports (full, SWA or both per node)
 * and its refusals, and every slot back in the pool at the end. Prints "N passed, M
 * failed"; exits non-zero on any failure.
 */
#include "radixkv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#include "abi_support.h"

/* What rkv_evict_kv reported, node by node. */
typedef struct {
  uint32_t freed[16];
  uint32_t first[16];
  size_t len[16];
  size_t nodes;
} report;

static void on_freed(void *ctx, uint32_t freed, const uint32_t *slots, size_t n) {
  report *r = (report *)ctx;
  if (r->nodes < 16) {
    r->freed[r->nodes] = freed;
    r->first[r->nodes] = slots[0];
    r->len[r->nodes] = n;
    r->nodes++;
  }
}

static void test_swa_window_cache(void) {
  rkv_options o = rkv_options_default();
  rkv_policy_options p = rkv_policy_options_default();
  rkv_cache *c = NULL;
  uint32_t slots[16], out[16];
  uint32_t a[4] = {1, 2, 3, 4}, b[6] = {1, 2, 3, 4, 5, 6};
  size_t n = SENTINEL_LEN;
  rkv_lock lock = SENTINEL_LOCK;
  report r;
  memset(&r, 0, sizeof r);
  CHECK(p.size == sizeof(rkv_policy_options) && p.swa_window == 0);
  o.pool_slots = 16;
  p.swa_window = 2;
  ST(rkv_cache_new_with(&o, &p, &c), RKV_OK);
  ST(rkv_alloc(c, 6, slots), RKV_OK);
  ST(rkv_insert(c, 0, b, slots, 6, &n), RKV_OK);
  CHECK(n == 0);
  /* Split at 4 and hold [5, 6]'s window: [1..4] is the only SWA candidate. */
  ST(rkv_insert(c, 0, a, slots, 4, &n), RKV_OK);
  ST(rkv_match_lock(c, 0, a, 4, out, 16, &n, &lock), RKV_OK);
  ST(rkv_release(c, lock), RKV_OK);
  ST(rkv_match_lock(c, 0, b, 6, out, 16, &n, &lock), RKV_OK);
  CHECK(n == 6);
  /* Refusals: nothing freed. */
  n = SENTINEL_LEN;
  ST(rkv_evict_kv(c, RKV_EVICT_TARGET_SWA, 4, NULL, NULL, &n), RKV_NULL_ARGUMENT);
  ST(rkv_evict_kv(c, 9, 4, on_freed, &r, &n), RKV_INVALID_ARGUMENT);
  ST(rkv_evict(c, 4, NULL, NULL, &n), RKV_INVALID_ARGUMENT);
  CHECK(n == SENTINEL_LEN && r.nodes == 0);
  /* [1..4] becomes an SWA tombstone: its SWA KV only. */
  ST(rkv_evict_kv(c, RKV_EVICT_TARGET_SWA, 1, on_freed, &r, &n), RKV_OK);
  CHECK(n == 4 && r.nodes == 1 && r.freed[0] == RKV_FREED_SWA);
  CHECK(r.first[0] == slots[0] && r.len[0] == 4);
  /* Nothing more: [5, 6] is in the lock's window. */
  ST(rkv_evict_kv(c, RKV_EVICT_TARGET_SWA, 100, on_freed, &r, &n), RKV_OK);
  CHECK(n == 0 && r.nodes == 1);
  /* A match ending on the tombstone is not valid; one 2 tokens past it is. */
  ST(rkv_match(c, 0, a, 4, out, 16, &n), RKV_OK);
  CHECK(n == 0);
  ST(rkv_match(c, 0, b, 6, out, 16, &n), RKV_OK);
  CHECK(n == 6 && out[0] == slots[0] && out[5] == slots[5]);
  ST(rkv_release(c, lock), RKV_OK);
  /* Full eviction: the leaf with its SWA KV, then the tombstone's full KV. */
  ST(rkv_evict_kv(c, RKV_EVICT_TARGET_FULL, 100, on_freed, &r, &n), RKV_OK);
  CHECK(n == 6 && r.nodes == 3);
  CHECK(r.freed[1] == (RKV_FREED_FULL | RKV_FREED_SWA) && r.first[1] == slots[4]);
  CHECK(r.freed[2] == RKV_FREED_FULL && r.first[2] == slots[0]);
  /* Every slot is back in the pool. */
  ST(rkv_alloc(c, 16, slots), RKV_OK);
  rkv_cache_free(c);
}

int main(void) {
  test_swa_window_cache();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
