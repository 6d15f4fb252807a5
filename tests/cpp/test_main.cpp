// 8 std::threads hammer one pooled cache through the C++ wrapper (match_lock, alloc,
// insert, insert_lock, release, evict, free), then slot conservation is checked:
// free + cached + held_by_threads == pool_slots, and after the threads give everything
// back, free + cached == pool_slots with nothing pinned.
#include <cstdlib>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "check.hpp"
#include "radixkv.hpp"

namespace {

constexpr std::uint64_t kPool = 2048;
constexpr int kThreads = 8;

struct Held {
  std::vector<std::uint32_t> slots;  // allocated, neither inserted nor freed
  std::vector<rkv::Lock> locks;      // pins kept across iterations
  long errors = 0;
};

void hammer(const rkv::Cache &cache, int id, int iters, Held &held) {
  std::mt19937 rng(1234u + static_cast<unsigned>(id));
  auto pick = [&rng](unsigned n) { return static_cast<unsigned>(rng() % n); };
  for (int it = 0; it < iters; ++it) {
    // Requests share a few system prompts, then diverge.
    std::uint64_t ns = pick(2);
    std::size_t len = 8 + pick(40);
    std::vector<std::uint32_t> toks(len);
    unsigned prompt = pick(4);
    for (std::size_t i = 0; i < len; ++i)
      toks[i] = i < 16 ? prompt * 1000 + static_cast<unsigned>(i) : pick(6);
    try {
      rkv::Lock lock = cache.match_lock(ns, toks);
      std::vector<std::uint32_t> slots = lock.slots();
      if (slots.size() != lock.length()) ++held.errors;
      std::vector<std::uint32_t> fresh;
      try {
        fresh = cache.alloc(len - lock.length());
      } catch (const rkv::Error &e) {
        if (e.status() != RKV_OUT_OF_SLOTS) ++held.errors;
        continue;  // the lock releases itself
      }
      slots.insert(slots.end(), fresh.begin(), fresh.end());
      switch (pick(4)) {
        case 0: {  // keep a pin across iterations (a running request)
          rkv::InsertLock r = cache.insert_lock(ns, toks, slots);
          if (r.existing < lock.length() || r.lock.length() != len) ++held.errors;
          held.locks.push_back(std::move(r.lock));
          break;
        }
        default:
          if (cache.insert(ns, toks, slots) < lock.length()) ++held.errors;
      }
      lock.release();
      bool double_release = false;
      try {
        lock.release();
      } catch (const rkv::Error &e) {
        double_release = e.status() == RKV_INVALID_LOCK;
      }
      if (!double_release) ++held.errors;
      if (held.locks.size() > 3) held.locks.erase(held.locks.begin());
      switch (pick(8)) {
        case 0:
          cache.evict(1 + pick(64));
          break;
        case 1: {  // pool mode: the callback is told about slots already back in the pool
          std::size_t told = 0;
          std::size_t n = cache.evict(1 + pick(64), [&told](const std::uint32_t *, std::size_t k) { told += k; });
          if (told != n) ++held.errors;
          break;
        }
        case 2: {  // hold a few slots for a while, give them back later
          std::vector<std::uint32_t> extra = cache.alloc(1 + pick(4));
          held.slots.insert(held.slots.end(), extra.begin(), extra.end());
          break;
        }
        case 3:
          if (!held.slots.empty()) {
            std::size_t k = 1 + pick(static_cast<unsigned>(held.slots.size()));
            std::vector<std::uint32_t> back(held.slots.end() - static_cast<std::ptrdiff_t>(k), held.slots.end());
            held.slots.resize(held.slots.size() - k);
            cache.free(back);
          }
          break;
        default:
          (void)cache.match(ns, toks);
      }
    } catch (const rkv::Error &e) {
      if (e.status() != RKV_OUT_OF_SLOTS) {
        std::fprintf(stderr, "thread %d: %s\n", id, e.what());
        ++held.errors;
      }
    }
  }
}

void threads_conserve_slots(int iters) {
  rkv::Cache cache(rkv::Options{1, rkv::Policy::lru, kPool});
  std::vector<Held> held(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back(hammer, std::cref(cache), t, iters, std::ref(held[static_cast<std::size_t>(t)]));
  for (auto &th : threads) th.join();

  std::size_t held_slots = 0;
  std::set<std::uint32_t> distinct;
  for (auto &h : held) {
    CHECK(h.errors == 0);
    held_slots += h.slots.size();
    distinct.insert(h.slots.begin(), h.slots.end());
  }
  CHECK(distinct.size() == held_slots);  // no slot handed to two threads
  rkv::Stats s = cache.stats();
  std::printf("after %d x %d iterations: free %llu, cached %llu, held %zu, protected %llu, nodes %llu\n",
              kThreads, iters, static_cast<unsigned long long>(s.free_slots),
              static_cast<unsigned long long>(s.cached_tokens), held_slots,
              static_cast<unsigned long long>(s.protected_tokens),
              static_cast<unsigned long long>(s.nodes));
  CHECK(s.free_slots + s.cached_tokens + held_slots == kPool);
  CHECK(s.cached_tokens == s.evictable_tokens + s.protected_tokens);

  for (auto &h : held) {
    cache.free(h.slots);
    h.locks.clear();  // releases
  }
  s = cache.stats();
  CHECK(s.protected_tokens == 0 && s.free_slots + s.cached_tokens == kPool);
  std::vector<std::uint32_t> freed = cache.evict_slots(SIZE_MAX);
  s = cache.stats();
  CHECK(s.cached_tokens == 0 && s.free_slots == kPool);
  CHECK(std::set<std::uint32_t>(freed.begin(), freed.end()).size() == freed.size());
}

}  // namespace

int main() {
  int iters = 2000;
  if (const char *e = std::getenv("RKV_CPP_ITERS")) iters = std::atoi(e);
  api_tests();
  lifetime_tests();
  events_tests();
  tier_tests();
  router_tests();
  request_tests();
  hybrid_tests();
  threads_conserve_slots(iters);
  std::printf("%d passed, %d failed\n", rkv_test::passed().load(), rkv_test::failed().load());
  return rkv_test::failed().load() == 0 ? 0 : 1;
}
