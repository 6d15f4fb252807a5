/* radixkv from C: two requests sharing a prompt prefix reuse its KV slots.
 *
 * Build against an installed radixkv (scripts/install --prefix DIR; see docs/install.md):
 *   cmake -S examples/c -B build -DCMAKE_PREFIX_PATH=DIR && cmake --build build
 *   cc main.c $(pkg-config --cflags --libs radixkv) -Wl,-rpath,$(pkg-config --variable=libdir radixkv)
 *   cc main.c $(pkg-config --cflags --libs radixkv-static)
 * Every call's status is checked; exits 1 on any failure or unexpected result. */
#include <radixkv.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                        \
  do {                                                                                     \
    rkv_status s_ = (call);                                                                \
    if (s_ != RKV_OK) {                                                                    \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,              \
              rkv_status_str(s_), rkv_last_error_message());                               \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

#define EXPECT(cond)                                                                       \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "%s:%d: unexpected: %s\n", __FILE__, __LINE__, #cond);               \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

enum { N = 8, POOL = 64 };

/* Serve one request: pin the cached prefix, allocate slots for the rest, "prefill", insert
 * the whole prompt, unpin. Returns how many tokens came from the cache. */
static size_t serve(const rkv_cache *cache, uint64_t ns, const uint32_t *tokens, size_t n) {
  uint32_t slots[N];
  size_t hit = 0, existing = 0;
  rkv_lock lock = 0;
  CHECK(rkv_match_lock(cache, ns, tokens, n, slots, N, &hit, &lock));
  CHECK(rkv_alloc(cache, n - hit, slots + hit)); /* fresh slots for the uncached suffix */
  /* ... run the model over tokens[hit..n], writing KV into slots[hit..n] ... */
  CHECK(rkv_insert(cache, ns, tokens, slots, n, &existing));
  EXPECT(existing == hit); /* nobody else inserted meanwhile */
  CHECK(rkv_release(cache, lock));
  return hit;
}

static void count_freed(void *ctx, const uint32_t *slots, size_t n_slots) {
  (void)slots;
  *(size_t *)ctx += n_slots;
}

int main(void) {
  printf("radixkv %s, ABI %u (header %d)\n", rkv_version(), rkv_abi_version(), RKV_ABI_VERSION);
  EXPECT(rkv_abi_version() == RKV_ABI_VERSION);

  rkv_options opts = rkv_options_default();
  opts.pool_slots = POOL; /* a built-in pool hands out the KV slots */
  rkv_cache *cache = NULL;
  CHECK(rkv_cache_new(&opts, &cache));

  const uint64_t ns = 0; /* e.g. one namespace per model or LoRA adapter */
  const uint32_t first[N] = {101, 7, 42, 42, 9, 1000, 3, 5};
  const uint32_t second[N] = {101, 7, 42, 42, 9, 2000, 4, 6}; /* same 5-token prefix */
  size_t hit1 = serve(cache, ns, first, N);
  size_t hit2 = serve(cache, ns, second, N);
  printf("request 1: %zu of %d tokens cached\n", hit1, N);
  printf("request 2: %zu of %d tokens cached\n", hit2, N);
  EXPECT(hit1 == 0 && hit2 == 5);

  rkv_stats st;
  CHECK(rkv_cache_stats(cache, &st));
  printf("cached %llu tokens in %llu nodes, %llu of %llu slots free\n",
         (unsigned long long)st.cached_tokens, (unsigned long long)st.nodes,
         (unsigned long long)st.free_slots, (unsigned long long)st.pool_slots);
  EXPECT(st.cached_tokens == 11 && st.free_slots == POOL - 11 && st.protected_tokens == 0);

  /* Evict everything (nothing is pinned any more): the slots go back to the pool, and the
   * callback sees each freed slot once. */
  size_t evicted = 0, seen = 0;
  CHECK(rkv_evict(cache, SIZE_MAX, count_freed, &seen, &evicted));
  CHECK(rkv_cache_stats(cache, &st));
  printf("evicted %zu tokens, %llu slots free\n", evicted, (unsigned long long)st.free_slots);
  EXPECT(evicted == 11 && seen == 11 && st.cached_tokens == 0 && st.free_slots == POOL);

  size_t len = 0;
  CHECK(rkv_match(cache, ns, first, N, NULL, 0, &len));
  EXPECT(len == 0);

  rkv_cache_free(cache);
  printf("ok\n");
  return 0;
}
