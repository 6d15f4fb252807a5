/* The request cycle through the C ABI (rkv_request_*): admit, slots, checkpoint, extend,
 * finish, abort; bad inputs; no slot lost; rkv_cache_free aborting live requests. */
#include "radixkv.h"
#include "check.h"

#include <stdint.h>
#include <stdlib.h>

static uint64_t free_slots(const rkv_cache *c) {
  rkv_stats s;
  CHECK_ST(rkv_cache_stats(c, &s), RKV_OK);
  return s.free_slots;
}

static rkv_cache *pool_cache(uint32_t page, uint64_t pool) {
  rkv_options o = rkv_options_default();
  rkv_cache *c = NULL;
  o.page_size = page;
  o.pool_slots = pool;
  CHECK_ST(rkv_cache_new(&o, &c), RKV_OK);
  return c;
}

static void cycle(void) {
  rkv_cache *c = pool_cache(4, 64);
  uint64_t start = free_slots(c);
  uint32_t prompt[10], more[3] = {10, 11, 12}, slots[16];
  size_t i, n = 0, e = 99;
  rkv_request *r = NULL, *r2 = NULL;
  rkv_request_info info;
  for (i = 0; i < 10; i++) prompt[i] = (uint32_t)i;

  CHECK_ST(rkv_request_admit(c, 7, prompt, 10, 0, &r), RKV_OK);
  CHECK_ST(rkv_request_info_get(r, &info), RKV_OK);
  CHECK(info.len == 10 && info.cached_len == 0 && info.locked_len == 0 && info.ns == 7);
  CHECK(free_slots(c) == start - 12);
  CHECK_ST(rkv_request_slots(r, NULL, 0, &n), RKV_OK);
  CHECK(n == 10);
  CHECK_ST(rkv_request_slots(r, slots, 4, &n), RKV_BUFFER_TOO_SMALL);
  CHECK(n == 10);
  CHECK_LAST_ERROR("too small");
  CHECK_ST(rkv_request_slots(r, slots, 16, &n), RKV_OK);
  CHECK(n == 10 && slots[0] != slots[1]);
  CHECK_ST(rkv_request_checkpoint(r, &e), RKV_OK);
  CHECK(e == 0);
  CHECK_ST(rkv_request_info_get(r, &info), RKV_OK);
  CHECK(info.locked_len == 8);
  CHECK_ST(rkv_request_extend(r, more, 3), RKV_OK);
  CHECK_ST(rkv_request_finish(r, &e), RKV_OK);
  CHECK(e == 8);

  CHECK_ST(rkv_request_admit(c, 7, prompt, 10, 0, &r2), RKV_OK);
  CHECK_ST(rkv_request_info_get(r2, &info), RKV_OK);
  CHECK(info.cached_len == 8 && info.locked_len == 8);
  rkv_request_abort(r2);
  rkv_request_abort(NULL);
  CHECK_ST(rkv_cache_reset(c), RKV_OK);
  CHECK(free_slots(c) == start);
  rkv_cache_free(c);
}

static void bad_inputs(void) {
  rkv_cache *c = pool_cache(1, 8), *np = pool_cache(1, 0);
  uint64_t start = free_slots(c);
  uint32_t t[3] = {1, 2, 3}, longer[9] = {0};
  size_t n = 0;
  rkv_request *r = NULL;
  rkv_request_info info;
  CHECK_ST(rkv_request_admit(NULL, 0, t, 3, 0, &r), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("cache is NULL");
  CHECK_ST(rkv_request_admit(c, 0, NULL, 3, 0, &r), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_request_admit(c, 0, t, 3, 0, NULL), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_request_admit(c, 0, t, 3, INT64_MAX, &r), RKV_INVALID_ARGUMENT);
  CHECK_ST(rkv_request_admit(c, 0, longer, 9, 0, &r), RKV_OUT_OF_SLOTS);
  CHECK_ST(rkv_request_admit(np, 0, t, 3, 0, &r), RKV_NO_POOL);
  CHECK(r == NULL);
  CHECK(free_slots(c) == start);

  CHECK_ST(rkv_request_admit(c, 0, t, 3, -5, &r), RKV_OK);
  CHECK_ST(rkv_request_extend(NULL, t, 3), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_request_extend(r, NULL, 3), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_request_extend(r, longer, 9), RKV_OUT_OF_SLOTS);
  CHECK_ST(rkv_request_checkpoint(r, NULL), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_request_info_get(NULL, &info), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_request_info_get(r, NULL), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_request_slots(r, NULL, 1, &n), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_request_slots(r, NULL, 0, NULL), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_request_finish(r, NULL), RKV_NULL_ARGUMENT); /* handle kept */
  CHECK_ST(rkv_request_info_get(r, &info), RKV_OK);
  CHECK(info.len == 3);
  rkv_request_abort(r);
  CHECK(free_slots(c) == start);
  rkv_cache_free(np);
  rkv_cache_free(c);
}

static void free_with_live_requests(void) {
  rkv_cache *c = pool_cache(2, 32);
  uint32_t t[5] = {1, 2, 3, 4, 5};
  size_t n = 0;
  rkv_request *a = NULL, *b = NULL;
  rkv_request_info info;
  CHECK_ST(rkv_request_admit(c, 0, t, 5, 0, &a), RKV_OK);
  CHECK_ST(rkv_request_admit(c, 0, t, 5, 0, &b), RKV_OK);
  CHECK_ST(rkv_request_checkpoint(a, &n), RKV_OK);
  rkv_cache_free(c); /* aborts a and b */
  CHECK_ST(rkv_request_info_get(a, &info), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("cache was freed");
  CHECK_ST(rkv_request_extend(a, t, 1), RKV_INVALID_ARGUMENT);
  CHECK_ST(rkv_request_finish(b, &n), RKV_INVALID_ARGUMENT); /* b consumed */
  rkv_request_abort(a);
}

int main(void) {
  cycle();
  bad_inputs();
  free_with_live_requests();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
