/* The hybrid tree through the C ABI (rkv_hybrid_*): an SWA + Mamba tree driven through
 * request cycles as SGLang's controller drives it (match and lock over every component,
 * insert with the request's KV and Mamba state, the insert's actions carried out by a
 * callback that rebuilds SWA values by calling back into the tree, the window refresh,
 * unlock), an early window release, an eviction walk per component, sizes against the
 * caller's books, rkv_hybrid_check, and "no index lost": every FULL index, SWA slot and
 * Mamba state handed in is either held by the tree (collect) or freed exactly once through
 * the callbacks. Also a recovery of a locked node's SWA value
 * (RECOVER_SWA_WITH_LOCKED_FULL), and bad inputs. */
#include "radixkv.h"
#include "check.h"

#include <stdint.h>
#include <stdlib.h>

#define NFULL 8192
#define NMAMBA 1024
#define MAMBA_BASE 500000
#define SWA_BASE 100000

/* The caller's books: 0 never handed out, 1 handed to the request or the tree, 2 freed. */
static unsigned char full_state[NFULL];
static unsigned char swa_live[NFULL]; /* by FULL index: an SWA slot the callback rebuilt */
static unsigned char mamba_state[NMAMBA];
static int64_t next_full, next_mamba;
static int bad_frees, rebuilds, recovers, set_failures;

static const rkv_hybrid *g_tree;

static void free_full(int64_t f) {
  if (f < 0 || f >= NFULL || full_state[f] != 1) {
    bad_frees++;
    fprintf(stderr, "FULL index %lld freed but not held\n", (long long)f);
    return;
  }
  full_state[f] = 2;
}

static void free_swa(int64_t f, int strict) {
  if (f < 0 || f >= NFULL || !swa_live[f]) {
    if (strict) {
      bad_frees++;
      fprintf(stderr, "SWA slot of FULL index %lld freed but not live\n", (long long)f);
    }
    return;
  }
  swa_live[f] = 0;
}

static void free_mamba(int64_t m) {
  int64_t i = m - MAMBA_BASE;
  if (i < 0 || i >= NMAMBA || mamba_state[i] != 1) {
    bad_frees++;
    fprintf(stderr, "Mamba state %lld freed but not held\n", (long long)m);
    return;
  }
  mamba_state[i] = 2;
}

static void on_free(void *ctx, uint32_t comp, const int64_t *v, size_t n) {
  size_t i;
  (void)ctx;
  for (i = 0; i < n; i++) {
    if (comp == RKV_HYBRID_FULL) free_full(v[i]);
    else if (comp == RKV_HYBRID_SWA) free_swa(v[i], 1);
    else if (comp == RKV_HYBRID_MAMBA) free_mamba(v[i]);
    else bad_frees++;
  }
}

/* Stores SWA slots for the FULL indices `full[0..n]` on `node`, calling back into the tree
 * (its mutex is released while actions run). */
static void rebuild(uint64_t node, const int64_t *full, size_t n) {
  int64_t swa[256];
  size_t i;
  if (n > 256) {
    set_failures++;
    return;
  }
  for (i = 0; i < n; i++) {
    swa[i] = full[i] + SWA_BASE;
    swa_live[full[i]] = 1;
  }
  if (rkv_hybrid_swa_set_value(g_tree, node, swa, n) != RKV_OK) {
    set_failures++;
    fprintf(stderr, "swa_set_value: %s\n", rkv_last_error_message());
  }
}

static void on_action(void *ctx, const rkv_hybrid_action *a) {
  size_t i;
  (void)ctx;
  switch (a->kind) {
    case RKV_HYBRID_FREE_DEVICE_KV: /* the request's duplicates: FULL and its SWA slots */
      for (i = 0; i < a->a_len; i++) {
        free_swa(a->a[i], 0);
        free_full(a->a[i]);
      }
      break;
    case RKV_HYBRID_FREE_DEVICE_KV_FULL_ONLY:
      for (i = 0; i < a->a_len; i++) free_full(a->a[i]);
      break;
    case RKV_HYBRID_SWA_REBUILD:
      rebuilds++;
      rebuild(a->node, a->a, a->a_len);
      break;
    case RKV_HYBRID_RECOVER_SWA_WITH_LOCKED_FULL:
      /* The node keeps its FULL indices (a); its SWA value is recovered from the request's
       * KV for the same tokens (b), which the request then no longer needs. */
      recovers++;
      rebuild(a->node, a->a, a->a_len);
      for (i = 0; i < a->b_len; i++) free_full(a->b[i]);
      break;
    default:
      bad_frees++;
  }
}

static uint64_t root_of(const rkv_hybrid *t) {
  uint64_t r = 0;
  CHECK_ST(rkv_hybrid_root(t, &r), RKV_OK);
  return r;
}

static size_t count(const unsigned char *v, size_t n, unsigned char want) {
  size_t i, k = 0;
  for (i = 0; i < n; i++) k += v[i] == want;
  return k;
}

/* The tree's sizes against the books (nothing locked between requests). */
static void check_books(const rkv_hybrid *t) {
  rkv_hybrid_sizes s;
  CHECK_ST(rkv_hybrid_sizes_get(t, &s), RKV_OK);
  CHECK(s.full_protected == 0 && s.swa_protected == 0 && s.mamba_protected == 0);
  CHECK(s.full_evictable == count(full_state, NFULL, 1));
  CHECK(s.swa_evictable == count(swa_live, NFULL, 1));
  CHECK(s.mamba_evictable == count(mamba_state, NMAMBA, 1));
  CHECK_ST(rkv_hybrid_check(t), RKV_OK);
  CHECK(bad_frees == 0 && set_failures == 0);
}

/* One request: two shared system prompts, then its own tail; page 2. */
static size_t make_key(int r, int64_t *key) {
  size_t i, len = 16 + 2 * (size_t)(r % 7);
  for (i = 0; i < len; i++) key[i] = i < 12 ? (r % 2) * 1000 + (int64_t)i : r * 100 + (int64_t)i;
  return len;
}

static void request(const rkv_hybrid *t, int r) {
  int64_t key[64], vals[64], state;
  size_t len = make_key(r, key), n = 0, i;
  rkv_hybrid_match_result m;
  rkv_hybrid_receipt lock, grown;
  rkv_hybrid_insert_result res;
  CHECK_ST(rkv_hybrid_match_lock(t, 0, key, len, &m, &lock), RKV_OK);
  CHECK(m.full_hit_len >= m.device_prefix_len);
  /* The reusable prefix's FULL indices, then fresh ones for the rest. */
  CHECK_ST(rkv_hybrid_collect(t, m.last_device_node, root_of(t), vals, 64, &n), RKV_OK);
  CHECK(n == m.device_prefix_len);
  for (i = 0; i < n; i++) CHECK(full_state[vals[i]] == 1);
  for (i = n; i < len; i++) {
    vals[i] = next_full;
    full_state[next_full++] = 1;
  }
  state = MAMBA_BASE + next_mamba;
  mamba_state[next_mamba++] = 1;
  CHECK_ST(rkv_hybrid_insert(t, 0, key, len, vals, len, m.device_prefix_len, 0, &state, 1,
                             on_action, NULL, &res, &grown),
           RKV_OK);
  if (!res.refreshed) CHECK_ST(rkv_hybrid_swa_refresh(t, res.node), RKV_OK);
  if (res.mamba_exist) free_mamba(state); /* the node kept its own: ours is ours to free */
  if (r % 5 == 3) {
    /* The window moved past the prefix: release the window (and Mamba) lock early. */
    CHECK_ST(rkv_hybrid_release_window(t, &lock, on_free, NULL), RKV_OK);
  }
  CHECK_ST(rkv_hybrid_unlock(t, &lock), RKV_OK);
  CHECK_ST(rkv_hybrid_unlock(t, &grown), RKV_OK);
  CHECK_ST(rkv_hybrid_unlock(t, &grown), RKV_INVALID_LOCK); /* once only */
}

static void evict_each(const rkv_hybrid *t) {
  rkv_hybrid_sizes before, after;
  uint64_t e = 0;
  CHECK_ST(rkv_hybrid_sizes_get(t, &before), RKV_OK);
  CHECK_ST(rkv_hybrid_evict(t, RKV_HYBRID_MAMBA, 2, on_free, NULL, &e), RKV_OK);
  CHECK(e >= (before.mamba_evictable < 2 ? before.mamba_evictable : 2));
  check_books(t);
  CHECK_ST(rkv_hybrid_sizes_get(t, &before), RKV_OK);
  CHECK_ST(rkv_hybrid_evict(t, RKV_HYBRID_SWA, 8, on_free, NULL, &e), RKV_OK);
  CHECK_ST(rkv_hybrid_sizes_get(t, &after), RKV_OK);
  CHECK(before.swa_evictable - after.swa_evictable == e);
  CHECK(e >= (before.swa_evictable < 8 ? before.swa_evictable : 8));
  check_books(t);
  CHECK_ST(rkv_hybrid_sizes_get(t, &before), RKV_OK);
  CHECK_ST(rkv_hybrid_evict(t, RKV_HYBRID_FULL, 10, on_free, NULL, &e), RKV_OK);
  CHECK_ST(rkv_hybrid_sizes_get(t, &after), RKV_OK);
  CHECK(before.full_evictable - after.full_evictable == e);
  CHECK(e >= (before.full_evictable < 10 ? before.full_evictable : 10));
  check_books(t);
}

/* A node whose FULL KV another request has locked, SWA-tombstoned meanwhile, inside a new
 * request's live window: the insert asks to recover its SWA value from the request's KV
 * (RECOVER_SWA_WITH_LOCKED_FULL), and the request's own indices for it are freed. */
static void recover(const rkv_hybrid *t) {
  int64_t key[10], vals[10], key2[10], vals2[10];
  size_t i;
  uint64_t e = 0;
  int before = recovers;
  rkv_hybrid_insert_result res, res2;
  rkv_hybrid_match_result m;
  rkv_hybrid_receipt a, b;
  for (i = 0; i < 10; i++) {
    key[i] = 70000 + (int64_t)i;
    key2[i] = i < 6 ? key[i] : 80000 + (int64_t)i;
    vals[i] = next_full;
    full_state[next_full++] = 1;
  }
  CHECK_ST(rkv_hybrid_insert(t, 1, key, 10, vals, 10, 0, 0, NULL, 0, on_action, NULL, &res, &a),
           RKV_OK);
  if (!res.refreshed) CHECK_ST(rkv_hybrid_swa_refresh(t, res.node), RKV_OK);
  /* Every SWA value not under a window lock goes: the locked path's older part becomes a
   * tombstone (its FULL KV stays, locked by request a). */
  CHECK_ST(rkv_hybrid_evict(t, RKV_HYBRID_SWA, UINT64_MAX, on_free, NULL, &e), RKV_OK);
  CHECK_ST(rkv_hybrid_match_lock(t, 1, key2, 10, &m, &b), RKV_OK);
  CHECK(m.device_prefix_len == 0 && m.full_hit_len == 6);
  for (i = 0; i < 10; i++) {
    vals2[i] = next_full;
    full_state[next_full++] = 1;
  }
  CHECK_ST(rkv_hybrid_insert(t, 1, key2, 10, vals2, 10, 0, 0, NULL, 0, on_action, NULL, &res2,
                             NULL),
           RKV_OK);
  CHECK(!res2.refreshed);
  CHECK_ST(rkv_hybrid_swa_refresh(t, res2.node), RKV_OK);
  CHECK(recovers == before + 1);
  for (i = 0; i < 6; i++) CHECK(full_state[vals2[i]] == 2 && swa_live[vals[i]]);
  CHECK_ST(rkv_hybrid_unlock(t, &b), RKV_OK);
  CHECK_ST(rkv_hybrid_unlock(t, &a), RKV_OK);
  check_books(t);
}

static void cycles(void) {
  rkv_hybrid_options o = rkv_hybrid_options_default();
  rkv_hybrid *t = NULL;
  int r;
  size_t i, n = 0;
  int64_t key[64], vals[64];
  rkv_hybrid_match_result m;
  CHECK(o.size == sizeof(rkv_hybrid_options));
  o.page_size = 2;
  o.swa_window = 4;
  o.mamba = 1;
  CHECK_ST(rkv_hybrid_new(&o, &t), RKV_OK);
  g_tree = t;
  for (r = 0; r < 60; r++) {
    request(t, r);
    check_books(t);
    if (r % 4 == 3) evict_each(t);
  }
  CHECK(rebuilds > 0);
  /* What the tree holds: the last request's path is all held, not freed. */
  i = make_key(59, key);
  CHECK_ST(rkv_hybrid_match(t, 0, key, i, &m), RKV_OK);
  CHECK_ST(rkv_hybrid_collect(t, m.last_device_node, root_of(t), vals, 64, &n), RKV_OK);
  CHECK(n == m.device_prefix_len && n > 0);
  for (i = 0; i < n; i++) CHECK(full_state[vals[i]] == 1);
  recover(t);
  /* Reset hands everything back: then every index handed in was freed exactly once. */
  CHECK_ST(rkv_hybrid_reset(t, on_free, NULL), RKV_OK);
  CHECK(count(full_state, NFULL, 1) == 0);
  CHECK(count(full_state, NFULL, 2) == (size_t)next_full);
  CHECK(count(swa_live, NFULL, 1) == 0);
  CHECK(count(mamba_state, NMAMBA, 2) == (size_t)next_mamba);
  check_books(t);
  printf("hybrid: %lld FULL indices, %lld Mamba states, %d SWA rebuilds, %d recoveries\n",
         (long long)next_full, (long long)next_mamba, rebuilds, recovers);
  rkv_hybrid_free(t);
}

static void bad_inputs(void) {
  rkv_hybrid_options o = rkv_hybrid_options_default();
  rkv_hybrid *t = NULL;
  rkv_hybrid_receipt lk = {0, 0, 0};
  rkv_hybrid_insert_result res;
  rkv_hybrid_match_result m;
  int64_t key[4] = {1, 2, 3, 4}, vals[4] = {5, 6, 7, 8}, buf[4];
  uint64_t e = 77;
  size_t n = 0;
  CHECK_ST(rkv_hybrid_new(NULL, &t), RKV_NULL_ARGUMENT);
  o.size = 8;
  CHECK_ST(rkv_hybrid_new(&o, &t), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("opts->size = 8");
  o = rkv_hybrid_options_default();
  o.page_size = 0;
  CHECK_ST(rkv_hybrid_new(&o, &t), RKV_INVALID_ARGUMENT);
  CHECK(t == NULL);
  o = rkv_hybrid_options_default(); /* FULL only */
  CHECK_ST(rkv_hybrid_new(&o, &t), RKV_OK);
  CHECK_ST(rkv_hybrid_match(NULL, 0, key, 4, &m), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_hybrid_match(t, 0, NULL, 4, &m), RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_hybrid_insert(t, 0, key, 4, vals, 3, 0, 0, NULL, 0, on_action, NULL, &res, NULL),
           RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("values has 3 indices");
  CHECK_ST(rkv_hybrid_insert(t, 0, key, 4, vals, 4, 0, 0, NULL, 0, NULL, NULL, &res, NULL),
           RKV_NULL_ARGUMENT);
  CHECK_ST(rkv_hybrid_evict(t, RKV_HYBRID_SWA, 4, on_free, NULL, &e), RKV_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("no such component");
  CHECK_ST(rkv_hybrid_evict(t, 7, 4, on_free, NULL, &e), RKV_INVALID_ARGUMENT);
  CHECK(e == 77);
  CHECK_ST(rkv_hybrid_lock(t, 4242, &lk), RKV_INVALID_ARGUMENT);
  CHECK_ST(rkv_hybrid_unlock(t, &lk), RKV_INVALID_LOCK);
  CHECK_ST(rkv_hybrid_insert(t, 0, key, 4, vals, 4, 0, 0, NULL, 0, on_action, NULL, &res, NULL),
           RKV_OK);
  CHECK_ST(rkv_hybrid_collect(t, res.node, root_of(t), buf, 2, &n), RKV_BUFFER_TOO_SMALL);
  CHECK(n == 4);
  CHECK_ST(rkv_hybrid_collect(t, res.node, root_of(t), NULL, 0, &n), RKV_OK);
  CHECK(n == 4);
  CHECK_ST(rkv_hybrid_check(t), RKV_OK);
  CHECK_ST(rkv_hybrid_check(NULL), RKV_NULL_ARGUMENT);
  rkv_hybrid_free(t);
  rkv_hybrid_free(NULL);
}

int main(void) {
  cycles();
  bad_inputs();
  CHECK(bad_frees == 0);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
