/*
 * The host tier's C ABI (rkv_tier_*) exercised from C: a full cycle under write_through
 * with the tier's own host stores (insert, device eviction, host_len seen, load-back, the
 * device-side bytes equal to what was written), write_through_selective and write_back,
 * a callback copier (deferred completion, failures rolled back: RKV_DEVICE_ERROR), NULL
 * pointers and bad options (a clear status, nothing changed), buffers too small (the
 * load-back result kept), tickets unknown or taken, events, and freeing a tier that
 * still holds locks and untaken results. Prints "N passed, M failed"; exits non-zero on
 * any failure.
 */
#include "radixkv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#define ST(call, want) CHECK_ST(call, want)

#define MSG_HAS(needle) CHECK_LAST_ERROR(needle)

enum { P = 4, DEV = 32, HOST = 64, LAYERS = 2, SB = 8 /* 1 head x 2 dims x 4 bytes */ };

static rkv_options dev_opts(void) {
  rkv_options o = rkv_options_default();
  o.page_size = P;
  o.pool_slots = DEV;
  return o;
}

static rkv_tier_options host_opts(uint32_t policy) {
  rkv_tier_options t = rkv_tier_options_default();
  t.host_slots = HOST;
  t.write_policy = policy;
  t.copier = RKV_COPIER_HOST;
  t.num_layers = LAYERS;
  t.num_kv_heads = 1;
  t.head_dim = 2;
  t.elem_bytes = 4;
  return t;
}

static rkv_tier *new_tier(const rkv_tier_options *t) {
  rkv_options o = dev_opts();
  rkv_tier *tier = NULL;
  ST(rkv_tier_new(&o, t, &tier), RKV_OK);
  return tier;
}

static rkv_tier_stats stats(const rkv_tier *t) {
  rkv_tier_stats s;
  memset(&s, 0, sizeof s);
  ST(rkv_tier_get_stats(t, &s), RKV_OK);
  return s;
}

/* The fake KV bytes of token `tok` at layer `l`, K (v = 0) or V (v = 1). */
static void pattern(uint32_t tok, int l, int v, unsigned char out[SB]) {
  uint32_t x = tok * 2654435761u + (uint32_t)l * 7u + (uint32_t)v;
  memcpy(out, &x, 4);
  memcpy(out + 4, &x, 4);
}

static unsigned char *kv(const rkv_tier *t, uint32_t side, int l, int v) {
  void *k = NULL, *vv = NULL;
  ST(rkv_tier_kv_ptr(t, side, (uint32_t)l, &k, &vv), RKV_OK);
  return (unsigned char *)(v ? vv : k);
}

/* Whether the tier has KV stores of its own (RKV_COPIER_HOST). */
static int has_stores(const rkv_tier *t) {
  void *k, *v;
  return rkv_tier_kv_ptr(t, RKV_SIDE_DEVICE, 0, &k, &v) == RKV_OK;
}

static void write_slots(const rkv_tier *t, const uint32_t *slots, const uint32_t *tokens,
                        size_t n) {
  size_t i;
  int l, v;
  if (!has_stores(t)) return;
  for (i = 0; i < n; i++)
    for (l = 0; l < LAYERS; l++)
      for (v = 0; v < 2; v++) pattern(tokens[i], l, v, kv(t, RKV_SIDE_DEVICE, l, v) + slots[i] * SB);
}

/* Whether the device-side bytes of `slots` are the pattern of `tokens`. */
static int bytes_match(const rkv_tier *t, const uint32_t *slots, const uint32_t *tokens,
                       size_t n) {
  size_t i;
  int l, v;
  unsigned char want[SB];
  for (i = 0; i < n; i++)
    for (l = 0; l < LAYERS; l++)
      for (v = 0; v < 2; v++) {
        pattern(tokens[i], l, v, want);
        if (memcmp(kv(t, RKV_SIDE_DEVICE, l, v) + slots[i] * SB, want, SB) != 0) return 0;
      }
  return 1;
}

static void zero_device(const rkv_tier *t) {
  int l, v;
  for (l = 0; l < LAYERS; l++)
    for (v = 0; v < 2; v++) memset(kv(t, RKV_SIDE_DEVICE, l, v), 0, (size_t)DEV * SB);
}

/* The request cycle: match and pin, allocate the rest, write its bytes, insert, release. */
static size_t request(const rkv_tier *t, const uint32_t *tokens, size_t n) {
  uint32_t slots[64];
  size_t m = 0, h = 0, existing = 0;
  rkv_lock lock = 0;
  ST(rkv_tier_match(t, 0, tokens, n, slots, 64, &m, &h, &lock), RKV_OK);
  ST(rkv_tier_alloc(t, n - m, slots + m), RKV_OK);
  write_slots(t, slots + m, tokens + m, n - m);
  ST(rkv_tier_insert(t, 0, tokens, slots, n, &existing), RKV_OK);
  CHECK(existing == m);
  ST(rkv_tier_release(t, lock), RKV_OK);
  return m;
}

static void test_full_cycle_write_through(void) {
  rkv_tier_options o = host_opts(RKV_WRITE_THROUGH);
  rkv_tier *t = new_tier(&o);
  uint32_t tokens[8] = {11, 12, 13, 14, 15, 16, 17, 18};
  uint32_t slots[8], small[1];
  size_t m = 99, h = 99, ev = 0, n = 0;
  uint64_t ticket = 0;
  rkv_load_result r;
  rkv_tier_stats s;
  int done = -1;

  CHECK(request(t, tokens, 8) == 0);
  s = stats(t);
  CHECK(s.tokens_to_host == 8 && s.copies_to_host == 1);
  CHECK(s.host_backed_slots == 8 && s.host_free_slots == HOST - 8);
  CHECK(s.host_resident_pages == 2);
  ST(rkv_tier_check(t), RKV_OK);

  ST(rkv_tier_match(t, 0, tokens, 8, slots, 8, &m, &h, NULL), RKV_OK);
  CHECK(m == 8 && h == 0);

  /* Evict the device: the host copies stay, host-only. */
  ST(rkv_tier_evict(t, 8, &ev), RKV_OK);
  CHECK(ev == 8);
  s = stats(t);
  CHECK(s.device.cached_tokens == 0 && s.device.free_slots == DEV);
  CHECK(s.host_resident_pages == 0 && s.host_backed_slots == 8 && s.host_evictable_pages >= 1);
  ST(rkv_tier_check(t), RKV_OK);
  zero_device(t);

  ST(rkv_tier_match(t, 0, tokens, 8, slots, 8, &m, &h, NULL), RKV_OK);
  CHECK(m == 0 && h == 8);

  /* Load back; a buffer too small keeps the result for the next call. */
  ST(rkv_tier_load_back(t, 0, tokens, 8, SIZE_MAX, &ticket), RKV_OK);
  n = 0;
  ST(rkv_tier_load_wait(t, ticket, small, 1, &n, &r), RKV_BUFFER_TOO_SMALL);
  CHECK(n == 8);
  MSG_HAS("kept");
  memset(&r, 0, sizeof r);
  ST(rkv_tier_load_poll(t, ticket, slots, 8, &n, &r, &done), RKV_OK);
  CHECK(done == 1 && n == 8);
  CHECK(r.len == 8 && r.device_len == 0 && r.loaded == 8 && r.outcome == RKV_LOAD_LOADED);
  CHECK(r.lock != 0);
  CHECK(bytes_match(t, slots, tokens, 8));
  ST(rkv_tier_lock_len(t, r.lock, &n), RKV_OK);
  CHECK(n == 8);
  s = stats(t);
  CHECK(s.tokens_to_device == 8 && s.load_backs == 1 && s.copies_to_device == 1);
  CHECK(s.device.cached_tokens == 8 && s.device.protected_tokens == 8);
  CHECK(s.host_resident_pages == 2 && s.host_pinned_pages == 0);
  ST(rkv_tier_release(t, r.lock), RKV_OK);
  ST(rkv_tier_release(t, r.lock), RKV_INVALID_LOCK);
  ST(rkv_tier_check(t), RKV_OK);

  /* The ticket was taken; an unknown one is refused too. */
  ST(rkv_tier_load_wait(t, ticket, slots, 8, &n, &r), RKV_INVALID_ARGUMENT);
  MSG_HAS("unknown or its result was taken");
  ST(rkv_tier_load_poll(t, 123456, slots, 8, &n, &r, &done), RKV_INVALID_ARGUMENT);

  /* Nothing more on the host: done at once, a lock over the device match. */
  ST(rkv_tier_load_back(t, 0, tokens, 8, SIZE_MAX, &ticket), RKV_OK);
  ST(rkv_tier_load_wait(t, ticket, slots, 8, &n, &r), RKV_OK);
  CHECK(r.outcome == RKV_LOAD_NOTHING_ON_HOST && r.len == 8 && r.loaded == 0);
  ST(rkv_tier_release(t, r.lock), RKV_OK);

  /* Host eviction takes only host-only pages: none now (both are on the device). */
  ST(rkv_tier_evict_host(t, 8, &ev), RKV_OK);
  CHECK(ev == 0);
  ST(rkv_tier_evict(t, 8, &ev), RKV_OK);
  ST(rkv_tier_evict_host(t, 8, &ev), RKV_OK);
  CHECK(ev == 8);
  s = stats(t);
  CHECK(s.host_backed_slots == 0 && s.host_free_slots == HOST && s.host_evicted_pages == 2);
  ST(rkv_tier_match(t, 0, tokens, 8, slots, 8, &m, &h, NULL), RKV_OK);
  CHECK(m == 0 && h == 0);
  ST(rkv_tier_check(t), RKV_OK);
  rkv_tier_free(t);
}

static void test_selective_and_write_back(void) {
  rkv_tier_options o = host_opts(RKV_WRITE_THROUGH_SELECTIVE);
  rkv_tier *t;
  uint32_t tokens[8] = {21, 22, 23, 24, 25, 26, 27, 28}, slots[8];
  size_t m, h, ev;
  rkv_tier_stats s;

  o.write_threshold = 2;
  t = new_tier(&o);
  request(t, tokens, 8);
  CHECK(stats(t).tokens_to_host == 0);
  CHECK(request(t, tokens, 8) == 8); /* the second hit backs the pages up */
  s = stats(t);
  CHECK(s.tokens_to_host == 8 && s.host_backed_slots == 8);
  ST(rkv_tier_check(t), RKV_OK);
  rkv_tier_free(t);

  o = host_opts(RKV_WRITE_BACK);
  t = new_tier(&o);
  request(t, tokens, 8);
  s = stats(t);
  CHECK(s.tokens_to_host == 0 && s.host_backed_slots == 0);
  ST(rkv_tier_evict(t, 8, &ev), RKV_OK);
  s = stats(t);
  CHECK(s.tokens_written_back == 8 && s.tokens_to_host == 8 && s.host_backed_slots == 8);
  zero_device(t);
  ST(rkv_tier_match(t, 0, tokens, 8, slots, 8, &m, &h, NULL), RKV_OK);
  CHECK(m == 0 && h == 8);
  {
    uint64_t ticket;
    rkv_load_result r;
    size_t n;
    ST(rkv_tier_load_back(t, 0, tokens, 8, SIZE_MAX, &ticket), RKV_OK);
    ST(rkv_tier_load_wait(t, ticket, slots, 8, &n, &r), RKV_OK);
    CHECK(r.loaded == 8 && bytes_match(t, slots, tokens, 8));
    ST(rkv_tier_release(t, r.lock), RKV_OK);
  }
  ST(rkv_tier_check(t), RKV_OK);
  rkv_tier_free(t);
}

/* A callback copier with no bytes: copies complete after `delay` polls (a wait completes
 * at once); it fails the directions asked for, when starting or when completing. */
#define MAX_COPIES 64
typedef struct {
  int delay;
  int fail_start_to_host, fail_start_to_device;
  int fail_done_to_host, fail_done_to_device;
  int polls_left[MAX_COPIES];
  int to_host[MAX_COPIES];
  int live[MAX_COPIES];
  uint64_t next;
  int calls;
} fake_copier;

static rkv_status start(fake_copier *f, int to_host, size_t n, uint64_t *out) {
  uint64_t t;
  f->calls++;
  if (n == 0) return RKV_INVALID_ARGUMENT;
  if (to_host ? f->fail_start_to_host : f->fail_start_to_device) return RKV_DEVICE_ERROR;
  t = f->next++ % MAX_COPIES;
  f->polls_left[t] = f->delay;
  f->to_host[t] = to_host;
  f->live[t] = 1;
  *out = t;
  return RKV_OK;
}

static rkv_status cb_to_host(void *u, const uint32_t *d, const uint32_t *h, size_t n,
                             uint64_t *out) {
  (void)d;
  (void)h;
  return start((fake_copier *)u, 1, n, out);
}

static rkv_status cb_to_device(void *u, const uint32_t *h, const uint32_t *d, size_t n,
                               uint64_t *out) {
  (void)d;
  (void)h;
  return start((fake_copier *)u, 0, n, out);
}

static rkv_status finish(fake_copier *f, uint64_t t) {
  if (t >= MAX_COPIES || !f->live[t]) return RKV_INVALID_ARGUMENT;
  f->live[t] = 0;
  if (f->to_host[t] ? f->fail_done_to_host : f->fail_done_to_device) return RKV_DEVICE_ERROR;
  return RKV_OK;
}

static rkv_status cb_poll(void *u, uint64_t t, int *done) {
  fake_copier *f = (fake_copier *)u;
  f->calls++;
  if (t < MAX_COPIES && f->live[t] && f->polls_left[t] > 0) {
    f->polls_left[t]--;
    *done = 0;
    return RKV_OK;
  }
  *done = 1;
  return finish(f, t);
}

static rkv_status cb_wait(void *u, uint64_t t) {
  fake_copier *f = (fake_copier *)u;
  f->calls++;
  return finish(f, t);
}

static rkv_tier *callback_tier(fake_copier *f, uint32_t policy) {
  rkv_tier_options o = rkv_tier_options_default();
  o.host_slots = HOST;
  o.write_policy = policy;
  o.copier = RKV_COPIER_CALLBACK;
  o.callbacks.user_data = f;
  o.callbacks.to_host = cb_to_host;
  o.callbacks.to_device = cb_to_device;
  o.callbacks.poll = cb_poll;
  o.callbacks.wait = cb_wait;
  return new_tier(&o);
}

static void test_callback_copier(void) {
  fake_copier f;
  rkv_tier *t;
  uint32_t tokens[8] = {31, 32, 33, 34, 35, 36, 37, 38}, slots[8];
  size_t m, h, ev, n, fin;
  uint64_t ticket;
  rkv_load_result r;
  rkv_tier_stats s, before;
  int done;

  /* Deferred completion: a backup in flight pins its pages; poll finishes it. */
  memset(&f, 0, sizeof f);
  f.delay = 2;
  t = callback_tier(&f, RKV_WRITE_THROUGH);
  request(t, tokens, 8);
  s = stats(t);
  CHECK(s.in_flight == 1 && s.host_backed_slots == 8 && s.tokens_to_host == 0);
  CHECK(s.device.protected_tokens == 8);
  ST(rkv_tier_check(t), RKV_INVALID_ARGUMENT);
  MSG_HAS("rkv_tier_wait_all");
  ST(rkv_tier_evict(t, 8, &ev), RKV_OK);
  CHECK(ev == 0); /* pinned by the backup */
  ST(rkv_tier_poll(t, &fin), RKV_OK);
  ST(rkv_tier_wait_all(t), RKV_OK);
  s = stats(t);
  CHECK(s.in_flight == 0 && s.tokens_to_host == 8 && s.device.protected_tokens == 0);
  ST(rkv_tier_check(t), RKV_OK);

  /* A deferred load-back: not done, then done. */
  ST(rkv_tier_evict(t, 8, &ev), RKV_OK);
  CHECK(ev == 8);
  ST(rkv_tier_load_back(t, 0, tokens, 8, SIZE_MAX, &ticket), RKV_OK);
  done = -1;
  n = 77;
  ST(rkv_tier_load_poll(t, ticket, slots, 8, &n, &r, &done), RKV_OK);
  CHECK(done == 0 && n == 77);
  CHECK(stats(t).host_pinned_pages == 2);
  ST(rkv_tier_load_wait(t, ticket, slots, 8, &n, &r), RKV_OK);
  CHECK(r.loaded == 8 && r.outcome == RKV_LOAD_LOADED && n == 8);
  ST(rkv_tier_release(t, r.lock), RKV_OK);
  ST(rkv_tier_check(t), RKV_OK);

  /* A load-back whose copy fails on completion: RKV_DEVICE_ERROR, all rolled back. */
  ST(rkv_tier_evict(t, 8, &ev), RKV_OK);
  f.fail_done_to_device = 1;
  before = stats(t);
  ST(rkv_tier_load_back(t, 0, tokens, 8, SIZE_MAX, &ticket), RKV_OK);
  ST(rkv_tier_load_wait(t, ticket, slots, 8, &n, &r), RKV_DEVICE_ERROR);
  MSG_HAS("wait callback returned status 8");
  s = stats(t);
  CHECK(s.copy_failures == before.copy_failures + 1);
  CHECK(s.device.free_slots == DEV && s.device.cached_tokens == 0);
  CHECK(s.host_pinned_pages == 0 && s.host_backed_slots == 8 && s.load_backs == before.load_backs);
  ST(rkv_tier_check(t), RKV_OK);
  ST(rkv_tier_load_wait(t, ticket, slots, 8, &n, &r), RKV_INVALID_ARGUMENT); /* spent */
  ST(rkv_tier_match(t, 0, tokens, 8, slots, 8, &m, &h, NULL), RKV_OK);
  CHECK(m == 0 && h == 8); /* the host copies are still there */

  /* A copy that cannot start: RKV_DEVICE_ERROR from load_back, no ticket, nothing kept. */
  f.fail_done_to_device = 0;
  f.fail_start_to_device = 1;
  before = stats(t);
  ticket = 4242;
  ST(rkv_tier_load_back(t, 0, tokens, 8, SIZE_MAX, &ticket), RKV_DEVICE_ERROR);
  CHECK(ticket == 4242);
  s = stats(t);
  CHECK(s.copy_failures == before.copy_failures + 1 && s.device.free_slots == DEV);
  CHECK(s.host_pinned_pages == 0);
  ST(rkv_tier_check(t), RKV_OK);
  rkv_tier_free(t);

  /* A backup that fails: the host copies are dropped, the device pages unpinned. */
  memset(&f, 0, sizeof f);
  f.fail_done_to_host = 1;
  t = callback_tier(&f, RKV_WRITE_THROUGH);
  request(t, tokens, 8);
  ST(rkv_tier_wait_all(t), RKV_OK);
  s = stats(t);
  CHECK(s.copy_failures == 1 && s.host_backed_slots == 0 && s.host_free_slots == HOST);
  CHECK(s.tokens_to_host == 0 && s.device.protected_tokens == 0 && s.device.cached_tokens == 8);
  ST(rkv_tier_check(t), RKV_OK);
  ST(rkv_tier_evict(t, 8, &ev), RKV_OK);
  ST(rkv_tier_match(t, 0, tokens, 8, slots, 8, &m, &h, NULL), RKV_OK);
  CHECK(m == 0 && h == 0);
  rkv_tier_free(t);
}

static void test_refusals(void) {
  rkv_options d = dev_opts();
  rkv_tier_options o = host_opts(RKV_WRITE_THROUGH), b;
  rkv_tier *sentinel = (rkv_tier *)&o, *out = sentinel, *t;
  uint32_t tokens[8] = {41, 42, 43, 44, 45, 46, 47, 48}, slots[8], small[2];
  size_t m = 0, h = 0, n = 0, ev = 0;
  rkv_lock lock = 0;
  uint64_t ticket = 0;
  rkv_load_result r;
  rkv_tier_stats before, after;
  void *k, *v;
  int done;

  /* rkv_tier_new: NULLs and bad options; *out_tier untouched. */
  ST(rkv_tier_new(NULL, &o, &out), RKV_NULL_ARGUMENT);
  ST(rkv_tier_new(&d, NULL, &out), RKV_NULL_ARGUMENT);
  MSG_HAS("tier_opts is NULL");
  ST(rkv_tier_new(&d, &o, NULL), RKV_NULL_ARGUMENT);
  d.pool_slots = 0;
  ST(rkv_tier_new(&d, &o, &out), RKV_INVALID_ARGUMENT);
  MSG_HAS("pool_slots = 0");
  d = dev_opts();
  d.page_size = 0;
  ST(rkv_tier_new(&d, &o, &out), RKV_INVALID_ARGUMENT);
  d = dev_opts();
#define BAD(field, value, status, needle)                                                \
  do {                                                                                   \
    b = o;                                                                               \
    b.field = value;                                                                     \
    ST(rkv_tier_new(&d, &b, &out), status);                                              \
    MSG_HAS(needle);                                                                     \
  } while (0)
  BAD(size, 8, RKV_INVALID_ARGUMENT, "tier_opts->size = 8");
  BAD(host_slots, 0, RKV_INVALID_ARGUMENT, "host_slots = 0");
  BAD(host_slots, 6, RKV_INVALID_ARGUMENT, "multiple of the page size 4");
  BAD(write_policy, 7, RKV_INVALID_ARGUMENT, "write_policy = 7");
  BAD(copier, 9, RKV_INVALID_ARGUMENT, "copier = 9");
  BAD(host_policy, 99, RKV_INVALID_ARGUMENT, "host_policy = 99");
  BAD(write_threshold, 0, RKV_INVALID_ARGUMENT, "write_threshold = 0");
  BAD(reserved, 1, RKV_INVALID_ARGUMENT, "reserved = 1");
  BAD(num_layers, 0, RKV_INVALID_ARGUMENT, "num_layers must be at least 1");
  b = o;
  b.copier = RKV_COPIER_CALLBACK;
  b.callbacks.to_host = cb_to_host;
  b.callbacks.to_device = cb_to_device;
  b.callbacks.poll = NULL;
  b.callbacks.wait = cb_wait;
  ST(rkv_tier_new(&d, &b, &out), RKV_NULL_ARGUMENT);
  MSG_HAS("callbacks.poll is NULL");
  CHECK(out == sentinel);
  /* An index-only tier, a host policy of its own. */
  b = rkv_tier_options_default();
  b.host_slots = HOST;
  b.host_policy = RKV_EVICT_FIFO;
  ST(rkv_tier_new(&d, &b, &out), RKV_OK);
  CHECK(out != sentinel && out != NULL);
  ST(rkv_tier_kv_ptr(out, RKV_SIDE_DEVICE, 0, &k, &v), RKV_INVALID_ARGUMENT);
  MSG_HAS("only RKV_COPIER_HOST");
  rkv_tier_free(out);
  rkv_tier_free(NULL);

  t = new_tier(&o);
  ST(rkv_tier_kv_ptr(t, 2, 0, &k, &v), RKV_INVALID_ARGUMENT);
  ST(rkv_tier_kv_ptr(t, RKV_SIDE_HOST, LAYERS, &k, &v), RKV_INVALID_ARGUMENT);
  MSG_HAS("out of range");
  ST(rkv_tier_kv_ptr(t, RKV_SIDE_HOST, 0, NULL, &v), RKV_NULL_ARGUMENT);
  CHECK(kv(t, RKV_SIDE_HOST, 1, 1) != kv(t, RKV_SIDE_DEVICE, 1, 1));

  /* NULL tier and NULL outputs, everywhere. */
  ST(rkv_tier_match(NULL, 0, tokens, 8, slots, 8, &m, &h, NULL), RKV_NULL_ARGUMENT);
  MSG_HAS("tier is NULL");
  ST(rkv_tier_match(t, 0, NULL, 8, slots, 8, &m, &h, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_match(t, 0, tokens, 8, slots, 8, NULL, &h, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_match(t, 0, tokens, 8, slots, 8, &m, NULL, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_alloc(NULL, 4, slots), RKV_NULL_ARGUMENT);
  ST(rkv_tier_alloc(t, 4, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_free_slots(NULL, slots, 0), RKV_NULL_ARGUMENT);
  ST(rkv_tier_insert(NULL, 0, tokens, slots, 8, &n), RKV_NULL_ARGUMENT);
  ST(rkv_tier_insert(t, 0, tokens, slots, 8, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_insert_ex(t, 0, tokens, NULL, 8, NULL, &n), RKV_NULL_ARGUMENT);
  ST(rkv_tier_insert_lock_ex(t, 0, tokens, slots, 8, NULL, &n, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_evict(NULL, 1, &ev), RKV_NULL_ARGUMENT);
  ST(rkv_tier_evict(t, 1, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_evict_host(t, 1, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_load_back(NULL, 0, tokens, 8, 8, &ticket), RKV_NULL_ARGUMENT);
  ST(rkv_tier_load_back(t, 0, tokens, 8, 8, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_load_wait(t, 1, slots, 8, NULL, &r), RKV_NULL_ARGUMENT);
  ST(rkv_tier_load_wait(t, 1, slots, 8, &n, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_load_poll(t, 1, slots, 8, &n, &r, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_poll(NULL, &n), RKV_NULL_ARGUMENT);
  ST(rkv_tier_poll(t, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_wait_all(NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_get_stats(NULL, &before), RKV_NULL_ARGUMENT);
  ST(rkv_tier_get_stats(t, NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_check(NULL), RKV_NULL_ARGUMENT);
  ST(rkv_tier_release(NULL, 1), RKV_NULL_ARGUMENT);
  ST(rkv_tier_lock_len(t, 1, NULL), RKV_NULL_ARGUMENT);

  /* Bad slots, sizes and locks: nothing changed. */
  request(t, tokens, 4);
  before = stats(t);
  ST(rkv_tier_alloc(t, 3, slots), RKV_INVALID_ARGUMENT);
  MSG_HAS("multiple of the page size");
  ST(rkv_tier_alloc(t, DEV + 4, slots), RKV_OUT_OF_SLOTS);
  slots[0] = 4000;
  slots[1] = slots[2] = slots[3] = 4001;
  ST(rkv_tier_insert(t, 1, tokens, slots, 4, &n), RKV_INVALID_ARGUMENT);
  MSG_HAS("4000");
  {
    rkv_insert_options io = rkv_insert_options_default();
    io.reserved = 3;
    ST(rkv_tier_insert_ex(t, 1, tokens, slots, 4, &io, &n), RKV_INVALID_ARGUMENT);
    MSG_HAS("reserved");
  }
  slots[0] = 5;
  ST(rkv_tier_free_slots(t, slots, 1), RKV_DOUBLE_FREE);
  ST(rkv_tier_release(t, 0), RKV_INVALID_LOCK);
  ST(rkv_tier_lock_len(t, 12345, &n), RKV_INVALID_LOCK);
  ST(rkv_tier_load_wait(t, 99, slots, 8, &n, &r), RKV_INVALID_ARGUMENT);
  ST(rkv_tier_load_poll(t, 99, slots, 8, &n, &r, &done), RKV_INVALID_ARGUMENT);
  /* A match that does not fit: only *out_len written, nothing pinned or counted. */
  m = 0;
  h = 555;
  lock = 777;
  ST(rkv_tier_match(t, 0, tokens, 8, small, 2, &m, &h, &lock), RKV_BUFFER_TOO_SMALL);
  CHECK(m == 4 && h == 555 && lock == 777);
  after = stats(t);
  CHECK(memcmp(&before, &after, sizeof before) == 0);
  ST(rkv_tier_check(t), RKV_OK);

  /* A pinning match and a pinning insert hand out locks of this tier. */
  ST(rkv_tier_match(t, 0, tokens, 8, slots, 8, &m, &h, &lock), RKV_OK);
  CHECK(m == 4 && lock != 0);
  CHECK(stats(t).device.protected_tokens == 4);
  ST(rkv_tier_release(t, lock), RKV_OK);
  ST(rkv_tier_alloc(t, 4, slots + 4), RKV_OK);
  ST(rkv_tier_insert_lock_ex(t, 0, tokens, slots, 8, NULL, &n, &lock), RKV_OK);
  CHECK(n == 4);
  ST(rkv_tier_lock_len(t, lock, &n), RKV_OK);
  CHECK(n == 8);
  /* Freed with this lock still out and a load-back never taken: released by the free. */
  ST(rkv_tier_load_back(t, 0, tokens, 8, SIZE_MAX, &ticket), RKV_OK);
  rkv_tier_free(t);
}

static void test_events(void) {
  rkv_tier_options o = host_opts(RKV_WRITE_THROUGH);
  rkv_tier *t = new_tier(&o);
  rkv_events_options eo = rkv_events_options_default();
  uint32_t tokens[8] = {51, 52, 53, 54, 55, 56, 57, 58};
  uint64_t seq = 0, hashes[16];
  uint32_t toks[32];
  char strings[64];
  rkv_event events[8];
  rkv_events_drain_info info;
  int gpu = 0, cpu = 0;
  size_t i;

  ST(rkv_tier_events_flush(t, &seq), RKV_INVALID_ARGUMENT);
  MSG_HAS("not enabled on this tier");
  ST(rkv_tier_events_drain(t, events, 8, hashes, 16, toks, 32, strings, 64, &info),
     RKV_INVALID_ARGUMENT);
  ST(rkv_tier_events_enable(NULL, &eo), RKV_NULL_ARGUMENT);
  ST(rkv_tier_events_enable(t, NULL), RKV_NULL_ARGUMENT);
  eo.medium = 5;
  ST(rkv_tier_events_enable(t, &eo), RKV_INVALID_ARGUMENT);
  eo = rkv_events_options_default();
  ST(rkv_tier_events_enable(t, &eo), RKV_OK);
  ST(rkv_tier_events_enable(t, &eo), RKV_INVALID_ARGUMENT);
  MSG_HAS("already");
  request(t, tokens, 8);
  ST(rkv_tier_events_flush(t, &seq), RKV_OK);
  CHECK(seq != RKV_EVENTS_NO_SEQ);
  ST(rkv_tier_events_drain(t, NULL, 0, NULL, 0, NULL, 0, NULL, 0, &info), RKV_BUFFER_TOO_SMALL);
  CHECK(info.n_batches == 1 && info.n_events == 2);
  ST(rkv_tier_events_drain(t, events, 8, hashes, 16, toks, 32, strings, 64, &info), RKV_OK);
  CHECK(info.n_events == 2 && info.batches_left == 0);
  for (i = 0; i < info.n_events; i++) {
    CHECK(events[i].kind == RKV_EVENT_BLOCK_STORED && events[i].n_block_hashes == 2);
    if (events[i].medium == RKV_MEDIUM_GPU) gpu++;
    if (events[i].medium == RKV_MEDIUM_CPU_PINNED) cpu++;
  }
  CHECK(gpu == 1 && cpu == 1);
  CHECK(info.n_events == 2 && events[0].block_hashes[0] == events[1].block_hashes[0]);
  rkv_tier_free(t);
}

/* A plain rkv_cache made with host options (rkv_cache_new_host): the plain calls go through
 * the tier. */
static void test_cache_with_host(void) {
  rkv_options o = dev_opts();
  rkv_tier_options t = host_opts(RKV_WRITE_THROUGH);
  rkv_cache *c = NULL;
  rkv_options no_pool = o;
  no_pool.pool_slots = 0;
  ST(rkv_cache_new_host(&no_pool, NULL, &t, &c), RKV_INVALID_ARGUMENT);
  ST(rkv_cache_new_host(&o, NULL, NULL, &c), RKV_NULL_ARGUMENT);
  CHECK(c == NULL);
  ST(rkv_cache_new_host(&o, NULL, &t, &c), RKV_OK);
  uint32_t tokens[8] = {11, 12, 13, 14, 15, 16, 17, 18};
  uint32_t slots[8], out[8];
  size_t n = 0;
  ST(rkv_alloc(c, 8, slots), RKV_OK);
  ST(rkv_insert(c, 0, tokens, slots, 8, &n), RKV_OK);
  CHECK(n == 0);
  ST(rkv_cache_wait_all(c), RKV_OK);
  rkv_tier_stats s;
  memset(&s, 0, sizeof s);
  ST(rkv_cache_tier_stats(c, &s), RKV_OK);
  CHECK(s.tokens_to_host == 8 && s.host_backed_slots == 8 && s.host_resident_pages == 2);
  /* A device eviction keeps the host copies; a plain match counts the host's extension. */
  ST(rkv_evict(c, 8, NULL, NULL, &n), RKV_OK);
  CHECK(n == 8);
  ST(rkv_match(c, 0, tokens, 8, out, 8, &n), RKV_OK);
  CHECK(n == 0);
  ST(rkv_cache_tier_stats(c, &s), RKV_OK);
  CHECK(s.host_hit_tokens == 8 && s.host_resident_pages == 0 && s.host_backed_slots == 8);
  rkv_cache_free(c);
  /* Without a tier: its statistics are refused, waiting has nothing to do. */
  c = NULL;
  ST(rkv_cache_new(&o, &c), RKV_OK);
  ST(rkv_cache_tier_stats(c, &s), RKV_INVALID_ARGUMENT);
  MSG_HAS("no host tier");
  ST(rkv_cache_wait_all(c), RKV_OK);
  rkv_cache_free(c);
}

int main(void) {
  test_full_cycle_write_through();
  test_selective_and_write_back();
  test_callback_copier();
  test_refusals();
  test_events();
  test_cache_with_host();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
