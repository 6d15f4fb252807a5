// rkv::Request (the request cycle, rkv_request_*): admit, extend, checkpoint, finish,
// abort; RAII (the destructor aborts), moves, a Request outliving its Cache, errors.
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "check.hpp"
#include "radixkv.hpp"

namespace {

constexpr std::uint64_t kPool = 64;

void cycle_reuses_the_prefix() {
  rkv::Cache c(rkv::Options{4, rkv::Policy::lru, kPool});
  std::vector<std::uint32_t> prompt{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  {
    rkv::Request r = c.admit(7, prompt, 2);
    CHECK(r && r.size() == 10 && r.cached_len() == 0 && r.locked_len() == 0);
    CHECK(r.info().ns == 7);
    CHECK(r.slots().size() == 10);
    CHECK(c.stats().free_slots == kPool - 12);
    CHECK(r.checkpoint() == 0 && r.locked_len() == 8);
    r.extend(std::vector<std::uint32_t>{10, 11, 12});
    CHECK(r.size() == 13 && r.slots().size() == 13);
    CHECK(r.finish() == 8);
    CHECK(!r);
    CHECK_THROWS(r.finish(), RKV_NULL_ARGUMENT);  // empty: finished already
  }
  {
    rkv::Request r = c.admit(7, prompt);
    CHECK(r.cached_len() == 8);
    rkv::Request moved = std::move(r);
    CHECK(!r && moved && moved.locked_len() == 8);
    CHECK(c.stats().protected_tokens == 8);
  }  // ~Request aborts
  rkv::Stats s = c.stats();
  CHECK(s.protected_tokens == 0 && s.free_slots + s.cached_tokens == kPool);
  c.reset();
  CHECK(c.stats().free_slots == kPool);
}

void errors() {
  rkv::Cache c(rkv::Options{1, rkv::Policy::lru, 8});
  std::vector<std::uint32_t> longer(9, 1);
  CHECK_THROWS(c.admit(0, longer), RKV_OUT_OF_SLOTS);
  CHECK_THROWS(c.admit(0, std::vector<std::uint32_t>{1}, std::int64_t(1) << 40),
               RKV_INVALID_ARGUMENT);
  rkv::Cache np(rkv::Options{1, rkv::Policy::lru, 0});
  CHECK_THROWS(np.admit(0, std::vector<std::uint32_t>{1}), RKV_NO_POOL);
  rkv::Request r = c.admit(0, std::vector<std::uint32_t>{1, 2});
  CHECK_THROWS(r.extend(longer), RKV_OUT_OF_SLOTS);
  CHECK(r.size() == 2);
  r.abort();
  CHECK(!r);
  r.abort();  // a no-op
  CHECK_THROWS(r.slots(), RKV_NULL_ARGUMENT);
  CHECK(c.stats().free_slots == 8);
}

void request_outlives_cache() {
  rkv::Request r;
  {
    rkv::Cache c(rkv::Options{2, rkv::Policy::lru, 32});
    r = c.admit(0, std::vector<std::uint32_t>{1, 2, 3});
    (void)r.checkpoint();
  }  // ~Cache aborts r
  CHECK(static_cast<bool>(r));
  CHECK_THROWS(r.size(), RKV_INVALID_ARGUMENT);
  CHECK_THROWS(r.finish(), RKV_INVALID_ARGUMENT);
  CHECK(!r);
  // Destroyed across threads: ~Cache races with the other thread's ~Request.
  for (int round = 0; round < 20; ++round) {
    std::thread t;
    {
      rkv::Cache c(rkv::Options{1, rkv::Policy::lru, 4096});
      std::vector<rkv::Request> mine;
      for (std::uint32_t i = 0; i < 32; ++i) mine.push_back(c.admit(0, {&i, 1}));
      t = std::thread([m = std::move(mine)]() mutable {
        while (!m.empty()) m.pop_back();
      });
    }
    t.join();
  }
  CHECK(true);
}

}  // namespace

void request_tests() {
  cycle_reuses_the_prefix();
  errors();
  request_outlives_cache();
}
