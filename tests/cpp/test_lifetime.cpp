// An rkv::Lock that outlives its rkv::Cache: it used to call rkv_release on the freed
// cache (a use-after-free that blocked forever in the freed lock table's mutex). Now the
// Cache shares its handle with its Locks through a shared_ptr control block and each Lock
// holds a weak_ptr: destroying the Cache frees it and ends every pin, and a Lock left over
// releases nothing. run.sh runs this under `timeout` and valgrind.
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.hpp"
#include "radixkv.hpp"

namespace {

const std::vector<std::uint32_t> kToks{1, 2, 3, 4};

// The bug in the wild: members declared in the "wrong" order, so the Lock is destroyed
// after the Cache.
struct Engine {
  rkv::Lock pinned;
  rkv::Cache cache{rkv::Options{1, rkv::Policy::lru, 1024}};
  Engine() {
    cache.insert(0, kToks, cache.alloc(kToks.size()));
    pinned = cache.match_lock(0, kToks);
  }
};

void wrong_member_order() {
  {
    Engine e;
    CHECK(e.pinned && e.pinned.length() == 4 && e.cache.stats().protected_tokens == 4);
  }  // ~Cache, then ~Lock: no hang, no use-after-free
  CHECK(true);
}

void lock_outlives_cache() {
  rkv::Lock l;
  {
    rkv::Cache c(rkv::Options{1, rkv::Policy::lru, 64});
    c.insert(0, kToks, c.alloc(kToks.size()));
    l = c.match_lock(0, kToks);
    CHECK(l && c.stats().protected_tokens == 4);
  }
  CHECK(!l);             // the pin ended with the cache
  CHECK(l.length() == 4);  // what it matched stays readable
  CHECK_WHAT(l.release(), RKV_INVALID_LOCK, "rkv::Cache of this lock was destroyed");
  CHECK(!l && l.handle() == 0);
  CHECK_WHAT(l.release(), RKV_INVALID_LOCK, "this rkv::Lock is empty");
  rkv::Lock moved = std::move(l);  // moving a dead Lock is fine too
  CHECK(!moved);
}

void moves_keep_locks_working() {
  rkv::Cache a(rkv::Options{1, rkv::Policy::lru, 64});
  a.insert(0, kToks, a.alloc(kToks.size()));
  rkv::Lock l = a.match_lock(0, kToks);
  rkv::Cache b = std::move(a);  // the same C cache, now owned by b
  CHECK(l && b.stats().protected_tokens == 4);
  l.release();
  CHECK(b.stats().protected_tokens == 0);

  rkv::Lock l2 = b.match_lock(0, kToks);
  rkv::InsertLock il = b.insert_lock(1, kToks, b.alloc(kToks.size()));
  b = rkv::Cache(rkv::Options{1, rkv::Policy::lru, 64});  // frees the old cache
  CHECK(!l2 && !il.lock);
  CHECK(b.stats().protected_tokens == 0 && b.stats().cached_tokens == 0);
}

// Locks destroyed on other threads while (and after) the owning thread destroys the Cache:
// each either releases before the cache is freed, or finds it gone; never a freed cache.
void destroyed_across_threads() {
  for (int round = 0; round < 20; ++round) {
    std::vector<rkv::Lock> locks;
    std::thread t;
    {
      rkv::Cache c(rkv::Options{1, rkv::Policy::lru, 256});
      c.insert(0, kToks, c.alloc(kToks.size()));
      for (int i = 0; i < 64; ++i) locks.push_back(c.match_lock(0, kToks));
      t = std::thread([mine = std::move(locks)]() mutable {
        while (!mine.empty()) mine.pop_back();
      });
    }  // ~Cache races with the other thread's ~Lock
    t.join();
  }
  CHECK(true);
}

}  // namespace

void lifetime_tests() {
  wrong_member_order();
  lock_outlives_cache();
  moves_keep_locks_working();
  destroyed_across_threads();
}
