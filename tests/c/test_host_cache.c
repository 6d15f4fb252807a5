/*
 * The host tier through a plain rkv_cache (rkv_cache_new_host) exercised from C: rkv_match_ex
 * (device_len and host_len in one result, with and without RKV_MATCH_LOCK, the lengths
 * alone, a buffer too small), rkv_cache_load_back with rkv_cache_load_wait and
 * rkv_cache_load_poll (a callback copier that completes after some polls: *out_done = 0
 * writes nothing else; a failed copy is RKV_DEVICE_ERROR, rolled back), rkv_cache_evict_host,
 * every bad input (a clear status and message, nothing written, nothing changed), the same
 * calls on a cache without a tier (RKV_INVALID_ARGUMENT), and freeing a cache that still
 * holds untaken load-backs. Prints "N passed, M failed"; exits non-zero on any failure.
 */
#include "radixkv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { P = 4, DEV = 16, HOST = 32 };

/* A callback copier with no bytes: a copy to the device completes after `delay` polls (a
 * wait completes at once) and fails when `fail_to_device` is set; copies to the host are
 * done when first polled. */
#define MAX_COPIES 64
typedef struct {
  int delay, fail_to_device;
  int polls_left[MAX_COPIES], to_host[MAX_COPIES], live[MAX_COPIES];
  uint64_t next;
} fake_copier;

static rkv_status start(fake_copier *f, int to_host, size_t n, uint64_t *out) {
  uint64_t t;
  if (n == 0) return RKV_INVALID_ARGUMENT;
  t = f->next++ % MAX_COPIES;
  f->polls_left[t] = to_host ? 0 : f->delay;
  f->to_host[t] = to_host;
  f->live[t] = 1;
  *out = t;
  return RKV_OK;
}

static rkv_status cb_to_host(void *u, const uint32_t *d, const uint32_t *h, size_t n, uint64_t *out) {
  (void)d;
  (void)h;
  return start((fake_copier *)u, 1, n, out);
}

static rkv_status cb_to_device(void *u, const uint32_t *h, const uint32_t *d, size_t n, uint64_t *out) {
  (void)d;
  (void)h;
  return start((fake_copier *)u, 0, n, out);
}

static rkv_status finish(fake_copier *f, uint64_t t) {
  if (t >= MAX_COPIES || !f->live[t]) return RKV_INVALID_ARGUMENT;
  f->live[t] = 0;
  return (!f->to_host[t] && f->fail_to_device) ? RKV_DEVICE_ERROR : RKV_OK;
}

static rkv_status cb_poll(void *u, uint64_t t, int *done) {
  fake_copier *f = (fake_copier *)u;
  if (t < MAX_COPIES && f->live[t] && f->polls_left[t] > 0) {
    f->polls_left[t]--;
    *done = 0;
    return RKV_OK;
  }
  *done = 1;
  return finish(f, t);
}

static rkv_status cb_wait(void *u, uint64_t t) { return finish((fake_copier *)u, t); }

static rkv_cache *host_cache(fake_copier *f) {
  rkv_options o = rkv_options_default();
  rkv_tier_options t = rkv_tier_options_default();
  rkv_cache *c = NULL;
  o.page_size = P;
  o.pool_slots = DEV;
  t.host_slots = HOST;
  t.write_policy = RKV_WRITE_THROUGH;
  if (f) {
    t.copier = RKV_COPIER_CALLBACK;
    t.callbacks.user_data = f;
    t.callbacks.to_host = cb_to_host;
    t.callbacks.to_device = cb_to_device;
    t.callbacks.poll = cb_poll;
    t.callbacks.wait = cb_wait;
  }
  CHECK_ST(rkv_cache_new_host(&o, NULL, &t, &c), RKV_OK);
  return c;
}

static rkv_cache *plain_cache(void) {
  rkv_options o = rkv_options_default();
  rkv_cache *c = NULL;
  o.page_size = P;
  o.pool_slots = DEV;
  CHECK_ST(rkv_cache_new(&o, &c), RKV_OK);
  return c;
}

static void insert(rkv_cache *c, const uint32_t *tokens, size_t n) {
  uint32_t slots[64];
  size_t e = 99;
  CHECK_ST(rkv_alloc(c, n, slots), RKV_OK);
  CHECK_ST(rkv_insert(c, 0, tokens, slots, n, &e), RKV_OK);
}

/* Inserts tokens[0..8], backs them up (write_through) and evicts them from the device. */
static void host_only(rkv_cache *c, const uint32_t *tokens) {
  size_t ev = 0;
  insert(c, tokens, 8);
  CHECK_ST(rkv_cache_wait_all(c), RKV_OK);
  CHECK_ST(rkv_evict(c, 8, NULL, NULL, &ev), RKV_OK);
  CHECK(ev == 8);
}

static rkv_stats stats(const rkv_cache *c) {
  rkv_stats s;
  memset(&s, 0, sizeof s);
  CHECK_ST(rkv_cache_stats(c, &s), RKV_OK);
  return s;
}

static void test_match_ex_on_a_plain_cache(void) {
  rkv_cache *c = plain_cache();
  uint32_t a[10] = {1, 2, 3, 4, 5, 6, 7, 8, 99, 98}, out[10], want[10];
  size_t m = 0;
  rkv_match_options lock = rkv_match_options_default();
  rkv_match_result r;
  lock.flags = RKV_MATCH_LOCK;
  CHECK(lock.size == sizeof(rkv_match_options));
  insert(c, a, 8);
  CHECK_ST(rkv_match(c, 0, a, 10, want, 10, &m), RKV_OK);
  CHECK_ST(rkv_match_ex(c, 0, a, 10, NULL, out, 10, &r), RKV_OK);
  CHECK(r.device_len == 8 && r.host_len == 0 && r.lock == 0);
  CHECK(m == 8 && memcmp(out, want, 8 * sizeof out[0]) == 0);
  CHECK(stats(c).protected_tokens == 0);
  CHECK_ST(rkv_match_ex(c, 0, a, 10, &lock, out, 10, &r), RKV_OK);
  CHECK(r.device_len == 8 && r.lock != 0);
  CHECK(stats(c).protected_tokens == 8);
  CHECK_ST(rkv_release(c, r.lock), RKV_OK);
  CHECK_ST(rkv_release(c, r.lock), RKV_INVALID_LOCK);
  /* The lengths alone. */
  memset(&r, 0x5a, sizeof r);
  CHECK_ST(rkv_match_ex(c, 0, a, 10, NULL, NULL, 0, &r), RKV_OK);
  CHECK(r.device_len == 8 && r.host_len == 0 && r.lock == 0);
  /* Too small: only device_len written, nothing pinned. */
  memset(&r, 0x5a, sizeof r);
  CHECK_ST(rkv_match_ex(c, 0, a, 10, &lock, out, 4, &r), RKV_BUFFER_TOO_SMALL);
  CHECK_LAST_ERROR("rkv_match_ex");
  CHECK(r.device_len == 8 && r.host_len == 0x5a5a5a5a5a5a5a5aull && r.lock == 0x5a5a5a5a5a5a5a5aull);
  CHECK(stats(c).protected_tokens == 0);
  rkv_cache_free(c);
}

static void test_match_ex_refuses_bad_input(void) {
  rkv_cache *c = plain_cache();
  uint32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
  rkv_match_options bad_size = rkv_match_options_default(), bad_flag = rkv_match_options_default();
  rkv_match_result r, sentinel;
  rkv_stats before;
  insert(c, a, 8);
  before = stats(c);
  bad_size.size = 4;
  bad_flag.flags = 0x80;
  memset(&sentinel, 0x5a, sizeof sentinel);
  r = sentinel;
  CHECK_ST(rkv_match_ex(NULL, 0, a, 8, NULL, out, 8, &r), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("rkv_match_ex: cache is NULL");
  CHECK_ST(rkv_match_ex(c, 0, NULL, 8, NULL, out, 8, &r), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("tokens is NULL");
  CHECK_ST(rkv_match_ex(c, 0, a, 8, &bad_size, out, 8, &r), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("opts->size = 4");
  CHECK_ST(rkv_match_ex(c, 0, a, 8, &bad_flag, out, 8, &r), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("opts->flags = 0x80");
  CHECK_ST(rkv_match_ex(c, 0, a, 8, NULL, NULL, 8, &r), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("out_slots is NULL");
  CHECK_ST(rkv_match_ex(c, 0, a, 8, NULL, out, 8, NULL), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("out_result is NULL");
  CHECK(memcmp(&r, &sentinel, sizeof r) == 0);
  CHECK(stats(c).match_calls == before.match_calls && stats(c).protected_tokens == 0);
  rkv_cache_free(c);
}

static void test_host_len_and_load_back_through_rkv_cache(void) {
  rkv_cache *c = host_cache(NULL);
  uint32_t a[8] = {11, 12, 13, 14, 15, 16, 17, 18}, out[8], got[8];
  size_t len = 0, ev = 0;
  uint64_t ticket = 0;
  rkv_match_result r;
  rkv_load_result lr;
  rkv_tier_stats ts;
  int done = 7;
  host_only(c, a);
  CHECK_ST(rkv_match_ex(c, 0, a, 8, NULL, out, 8, &r), RKV_OK);
  CHECK(r.device_len == 0 && r.host_len == 8 && r.lock == 0);
  CHECK_ST(rkv_cache_load_back(c, 0, a, 8, SIZE_MAX, &ticket), RKV_OK);
  memset(&lr, 0, sizeof lr);
  CHECK_ST(rkv_cache_load_wait(c, ticket, out, 2, &len, &lr), RKV_BUFFER_TOO_SMALL);
  CHECK_LAST_ERROR("the result is kept");
  CHECK(len == 8 && lr.lock == 0);
  CHECK_ST(rkv_cache_load_wait(c, ticket, out, 8, &len, &lr), RKV_OK);
  CHECK(len == 8 && lr.len == 8 && lr.device_len == 0 && lr.loaded == 8 && lr.outcome == RKV_LOAD_LOADED);
  CHECK(stats(c).protected_tokens == 8);
  CHECK_ST(rkv_match_ex(c, 0, a, 8, NULL, got, 8, &r), RKV_OK);
  CHECK(r.device_len == 8 && r.host_len == 0 && memcmp(got, out, sizeof out) == 0);
  CHECK_ST(rkv_release(c, lr.lock), RKV_OK);
  CHECK_ST(rkv_cache_load_wait(c, ticket, out, 8, &len, &lr), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("taken already");
  /* Poll, half of it, then host eviction of what only the host holds. */
  CHECK_ST(rkv_evict(c, 8, NULL, NULL, &ev), RKV_OK);
  CHECK_ST(rkv_cache_load_back(c, 0, a, 8, 4, &ticket), RKV_OK);
  CHECK_ST(rkv_cache_load_poll(c, ticket, out, 8, &len, &lr, &done), RKV_OK);
  CHECK(done == 1 && len == 4 && lr.loaded == 4);
  CHECK_ST(rkv_release(c, lr.lock), RKV_OK);
  CHECK_ST(rkv_cache_evict_host(c, SIZE_MAX, &ev), RKV_OK);
  CHECK(ev == 4);
  CHECK_ST(rkv_match_ex(c, 0, a, 8, NULL, out, 8, &r), RKV_OK);
  CHECK(r.device_len == 4 && r.host_len == 0);
  memset(&ts, 0, sizeof ts);
  CHECK_ST(rkv_cache_tier_stats(c, &ts), RKV_OK);
  CHECK(ts.load_backs == 2 && ts.tokens_to_device == 12 && ts.host_evicted_pages == 1);
  rkv_cache_free(c);
}

static void test_deferred_and_failed_copies(void) {
  fake_copier f;
  rkv_cache *c;
  uint32_t a[8] = {21, 22, 23, 24, 25, 26, 27, 28}, out[8];
  size_t len = 0xdead;
  uint64_t ticket = 0;
  rkv_load_result lr;
  rkv_stats before;
  int done = 7;
  memset(&f, 0, sizeof f);
  f.delay = 2;
  c = host_cache(&f);
  host_only(c, a);
  CHECK_ST(rkv_cache_load_back(c, 0, a, 8, SIZE_MAX, &ticket), RKV_OK);
  memset(&lr, 0x5a, sizeof lr);
  CHECK_ST(rkv_cache_load_poll(c, ticket, out, 8, &len, &lr, &done), RKV_OK);
  CHECK(done == 0 && len == 0xdead && lr.lock == 0x5a5a5a5a5a5a5a5aull); /* running: nothing else */
  done = 7;
  while (done != 1) CHECK_ST(rkv_cache_load_poll(c, ticket, out, 8, &len, &lr, &done), RKV_OK);
  CHECK(len == 8 && lr.loaded == 8);
  CHECK_ST(rkv_release(c, lr.lock), RKV_OK);
  /* A failed copy: RKV_DEVICE_ERROR, everything rolled back, the ticket spent. */
  CHECK_ST(rkv_evict(c, 8, NULL, NULL, &len), RKV_OK);
  before = stats(c);
  f.fail_to_device = 1;
  CHECK_ST(rkv_cache_load_back(c, 0, a, 8, SIZE_MAX, &ticket), RKV_OK);
  CHECK_ST(rkv_cache_load_wait(c, ticket, out, 8, &len, &lr), RKV_DEVICE_ERROR);
  CHECK_LAST_ERROR("rkv_cache_load_wait: load-back ticket");
  CHECK(stats(c).free_slots == before.free_slots && stats(c).cached_tokens == before.cached_tokens);
  CHECK_ST(rkv_cache_load_wait(c, ticket, out, 8, &len, &lr), RKV_INVALID_ARGUMENT);
  /* Freed with a load-back never taken: it is waited for and released. */
  f.fail_to_device = 0;
  CHECK_ST(rkv_cache_load_back(c, 0, a, 8, SIZE_MAX, &ticket), RKV_OK);
  rkv_cache_free(c);
  CHECK(f.live[ticket % MAX_COPIES] == 0);
}

static void test_bad_input_and_no_tier(void) {
  rkv_cache *c = host_cache(NULL), *plain = plain_cache();
  uint32_t a[8] = {41, 42, 43, 44, 45, 46, 47, 48}, out[8];
  size_t len = 0xdead, ev = 0xdead;
  uint64_t ticket = 0xdead, t = 0;
  rkv_load_result lr;
  rkv_stats before, pb;
  int done = 7;
  memset(&lr, 0x5a, sizeof lr);
  host_only(c, a);
  insert(plain, a, 8);
  before = stats(c);
  pb = stats(plain);
  CHECK_ST(rkv_cache_load_back(NULL, 0, a, 8, 8, &ticket), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("rkv_cache_load_back: cache is NULL");
  CHECK_ST(rkv_cache_load_back(c, 0, NULL, 8, 8, &ticket), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("tokens is NULL");
  CHECK_ST(rkv_cache_load_back(c, 0, a, 8, 8, NULL), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("out_ticket is NULL");
  CHECK_ST(rkv_cache_load_wait(c, 777, out, 8, &len, &lr), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("load-back ticket 777 is unknown");
  CHECK_ST(rkv_cache_load_poll(c, 777, out, 8, &len, &lr, &done), RKV_INVALID_ARGUMENT);
  CHECK_ST(rkv_cache_load_wait(NULL, 1, out, 8, &len, &lr), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_cache_load_poll(NULL, 1, out, 8, &len, &lr, &done), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_cache_evict_host(NULL, 8, &ev), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_cache_evict_host(c, 8, NULL), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("out_evicted is NULL");
  /* A cache without a tier: each refused, naming what is missing. */
  CHECK_ST(rkv_cache_load_back(plain, 0, a, 8, 8, &ticket), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("rkv_cache_load_back: this cache has no host tier");
  CHECK_ST(rkv_cache_load_poll(plain, 1, out, 8, &len, &lr, &done), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("no host tier");
  CHECK_ST(rkv_cache_load_wait(plain, 1, out, 8, &len, &lr), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("no host tier");
  CHECK_ST(rkv_cache_evict_host(plain, 8, &ev), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("rkv_cache_new_host");
  /* A live ticket: each NULL output refused, and the result still there afterwards. */
  CHECK_ST(rkv_cache_load_back(c, 0, a, 8, 8, &t), RKV_OK);
  CHECK_ST(rkv_cache_load_wait(c, t, NULL, 8, &len, &lr), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_cache_load_wait(c, t, out, 8, NULL, &lr), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_cache_load_wait(c, t, out, 8, &len, NULL), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_cache_load_poll(c, t, out, 8, &len, &lr, NULL), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("out_done is NULL");
  CHECK(ticket == 0xdead && len == 0xdead && ev == 0xdead && done == 7 && lr.lock == 0x5a5a5a5a5a5a5a5aull);
  CHECK_ST(rkv_cache_load_wait(c, t, out, 8, &len, &lr), RKV_OK);
  CHECK(len == 8 && lr.loaded == 8);
  CHECK_ST(rkv_release(c, lr.lock), RKV_OK);
  CHECK(stats(c).free_slots + 8 == before.free_slots);
  CHECK(stats(plain).cached_tokens == pb.cached_tokens && stats(plain).free_slots == pb.free_slots);
  rkv_cache_free(c);
  rkv_cache_free(plain);
}

int main(void) {
  test_match_ex_on_a_plain_cache();
  test_match_ex_refuses_bad_input();
  test_host_len_and_load_back_through_rkv_cache();
  test_deferred_and_failed_copies();
  test_bad_input_and_no_tier();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
