/* The KV cache group of a cache's published events through the C ABI (issue 29):
 * rkv_kv_group_default, rkv_events_publish_ex's refusals of a bad group (status, message,
 * no output, the cache unchanged: it still drains) and a publisher started with a good one. */
#include "radixkv.h"
#include "check.h"

#include <stdint.h>

static rkv_cache *events_cache(void) {
  rkv_options o = rkv_options_default();
  rkv_events_options e = rkv_events_options_default();
  rkv_cache *c = NULL;
  o.page_size = 4;
  o.pool_slots = 64;
  CHECK_ST(rkv_cache_new(&o, &c), RKV_OK);
  CHECK_ST(rkv_events_enable(c, &e), RKV_OK);
  return c;
}

static rkv_publisher_options quick(void) {
  rkv_publisher_options o = rkv_publisher_options_default();
  o.endpoint = "tcp://127.0.0.1:*";
  o.auto_flush_ms = 0;
  o.linger_ms = 0;
  return o;
}

/* One refused group: the status, the message, no output. */
static void refused(rkv_cache *c, rkv_kv_group g, const char *needle) {
  rkv_publisher_options o = quick();
  rkv_publisher *p = (rkv_publisher *)&o; /* a sentinel: must stay untouched */
  CHECK_ST(rkv_events_publish_ex(c, &o, &g, &p), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("rkv_events_publish_ex: ");
  CHECK_LAST_ERROR(needle);
  CHECK(p == (rkv_publisher *)&o);
}

static void defaults(void) {
  rkv_kv_group d = rkv_kv_group_default();
  CHECK(d.size == sizeof(rkv_kv_group) && sizeof(rkv_kv_group) == 16);
  CHECK(d.group_idx == 0 && d.spec_kind == RKV_KV_FULL_ATTENTION && d.sliding_window == 0);
  CHECK(RKV_KV_SLIDING_WINDOW == 2 && RKV_KV_MAMBA == 4 && RKV_KV_UNKNOWN == 9);
}

static void bad_groups(void) {
  rkv_cache *c = events_cache();
  rkv_kv_group g = rkv_kv_group_default();
  rkv_publisher_options o = quick();
  rkv_publisher *p = NULL;
  uint32_t tokens[4] = {1, 2, 3, 4}, slots[4];
  size_t existing = 0;
  uint64_t seq = 0;

  g.size = 12;
  refused(c, g, "group->size = 12 is not the size of an rkv_kv_group");
  g = rkv_kv_group_default();
  g.spec_kind = 10;
  refused(c, g, "group->spec_kind = 10 is not an rkv_kv_cache_spec_kind");
  g.spec_kind = RKV_KV_SLIDING_WINDOW; /* no window */
  refused(c, g, "spec kind sliding_window needs its window");
  g.spec_kind = RKV_KV_FULL_ATTENTION;
  g.sliding_window = 128; /* a window without a sliding kind */
  refused(c, g, "a sliding window (128) only goes with");
  g.spec_kind = RKV_KV_MAMBA;
  refused(c, g, "not mamba");

  CHECK_ST(rkv_events_publish_ex(NULL, &o, NULL, &p), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("rkv_events_publish_ex: cache is NULL");
  CHECK_ST(rkv_events_publish_ex(c, NULL, NULL, &p), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("rkv_events_publish_ex: opts is NULL");
  CHECK_ST(rkv_events_publish_ex(c, &o, NULL, NULL), RKV_NULL_ARGUMENT);
  CHECK_LAST_ERROR("out_publisher is NULL");
  CHECK(p == NULL);

  /* Nothing was attached: the cache's events still drain. */
  CHECK_ST(rkv_alloc(c, 4, slots), RKV_OK);
  CHECK_ST(rkv_insert(c, 0, tokens, slots, 4, &existing), RKV_OK);
  CHECK_ST(rkv_events_flush(c, &seq), RKV_OK);
  CHECK(seq == 0);
  {
    rkv_events_stats s;
    CHECK_ST(rkv_events_counters(c, &s), RKV_OK);
    CHECK(s.batches == 1 && s.dropped == 0);
  }

  /* A sliding-window group with its window, and a Mamba group, start. */
  g = rkv_kv_group_default();
  g.group_idx = 3;
  g.spec_kind = RKV_KV_SLIDING_WINDOW;
  g.sliding_window = 4096;
  CHECK_ST(rkv_events_publish_ex(c, &o, &g, &p), RKV_OK);
  CHECK(p != NULL);
  CHECK_ST(rkv_publisher_stop(p), RKV_OK);
  rkv_publisher_free(p);
  p = NULL;
  g.spec_kind = RKV_KV_MAMBA;
  g.sliding_window = 0;
  CHECK_ST(rkv_events_publish_ex(c, &o, &g, &p), RKV_OK);
  rkv_publisher_free(p);
  rkv_cache_free(c);
}

int main(void) {
  defaults();
  bad_groups();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
