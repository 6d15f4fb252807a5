// Single-threaded checks of the C++ wrapper; a second translation unit including
// radixkv.hpp, linked into the same binary as test_main.cpp.
#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "radixkv.hpp"

namespace {

void caller_managed() {
  rkv::Cache c;  // page 1, LRU, no pool
  std::vector<std::uint32_t> toks{1, 2, 3, 4}, slots{10, 11, 12, 13};
  CHECK(c.match(0, toks).empty());
  CHECK(c.insert(0, toks, slots) == 0);
  CHECK(c.match(0, toks) == slots);
  CHECK(c.match_len(0, std::vector<std::uint32_t>{1, 2, 9}) == 2);
  CHECK(c.match(1, toks).empty());  // another namespace
  CHECK_THROWS(c.insert(0, toks, std::vector<std::uint32_t>{1}), RKV_INVALID_ARGUMENT);
  CHECK_THROWS(c.alloc(1), RKV_NO_POOL);
  CHECK_THROWS(c.evict(1), RKV_NULL_ARGUMENT);  // no pool: a callback is required

  {
    rkv::Lock l = c.match_lock(0, toks);
    CHECK(l && l.length() == 4 && l.slots() == slots && l.handle() != 0);
    CHECK(c.stats().protected_tokens == 4);
    CHECK(c.evict_slots(100).empty());  // all pinned
    rkv::Lock moved = std::move(l);
    CHECK(!l && moved && moved.length() == 4);  // NOLINT(bugprone-use-after-move)
    CHECK(c.stats().protected_tokens == 4);
    moved.release();
    CHECK(!moved);
    CHECK_THROWS(moved.release(), RKV_INVALID_LOCK);  // double release
    CHECK(c.stats().protected_tokens == 0);
  }
  {
    rkv::Lock l = c.match_lock(0, toks);
    rkv_lock raw = l.detach();
    CHECK(!l && c.lock_len(raw) == 4);
    c.release(raw);
    CHECK_THROWS(c.release(raw), RKV_INVALID_LOCK);
    CHECK_THROWS(c.lock_len(raw), RKV_INVALID_LOCK);
  }
  {
    rkv::Lock l = c.match_lock(0, toks);  // released by the destructor
    CHECK(c.stats().protected_tokens == 4);
  }
  CHECK(c.stats().protected_tokens == 0);
  {
    auto r = c.insert_lock(0, std::vector<std::uint32_t>{1, 2, 3, 4, 5},
                           std::vector<std::uint32_t>{0, 0, 0, 0, 14});
    CHECK(r.existing == 4 && r.lock.length() == 5);
    CHECK(c.stats().protected_tokens == 5);
  }
  // An exception from the callback comes out after the eviction completes.
  bool threw = false;
  try {
    c.evict(1, [](const std::uint32_t *, std::size_t) { throw std::runtime_error("boom"); });
  } catch (const std::runtime_error &e) {
    threw = std::string(e.what()) == "boom";
  }
  CHECK(threw);
  std::vector<std::uint32_t> freed = c.evict_slots(SIZE_MAX);
  CHECK(c.stats().cached_tokens == 0);
  CHECK(freed.size() < 5);  // the throwing call freed at least 1
  {
    // A callback that throws is still handed every freed slot (caller-managed slots would
    // otherwise be lost), and the first exception comes out after the eviction.
    CHECK(c.insert(9, std::vector<std::uint32_t>{1, 2}, std::vector<std::uint32_t>{50, 51}) == 0);
    CHECK(c.insert(9, std::vector<std::uint32_t>{3, 4}, std::vector<std::uint32_t>{52, 53}) == 0);
    CHECK(c.insert(9, std::vector<std::uint32_t>{5, 6}, std::vector<std::uint32_t>{54, 55}) == 0);
    std::vector<std::uint32_t> handed;
    int calls = 0;
    std::string what;
    try {
      c.evict(SIZE_MAX, [&](const std::uint32_t *s, std::size_t k) {
        handed.insert(handed.end(), s, s + k);
        throw std::runtime_error("boom " + std::to_string(++calls));
      });
    } catch (const std::runtime_error &e) {
      what = e.what();
    }
    std::sort(handed.begin(), handed.end());
    CHECK(calls == 3 && what == "boom 1");
    CHECK((handed == std::vector<std::uint32_t>{50, 51, 52, 53, 54, 55}));
    CHECK(c.stats().cached_tokens == 0);
  }
  {
    // match_runs: the matched slots as runs, in token order, a cut inside the second.
    CHECK(c.insert(5, std::vector<std::uint32_t>{1, 2, 3, 4, 5},
                   std::vector<std::uint32_t>{100, 101, 102, 200, 201}) == 0);
    std::vector<rkv_slot_run> m = c.match_runs(5, std::vector<std::uint32_t>{1, 2, 3, 4, 9});
    CHECK(m.size() == 2 && m[0].start == 100 && m[0].len == 3 && m[1].start == 200 &&
          m[1].len == 1);
    CHECK(c.match_runs(6, std::vector<std::uint32_t>{1, 2}).empty());
    {
      rkv::Lock l = c.match_lock_runs(5, std::vector<std::uint32_t>{1, 2, 3, 4, 9});
      CHECK(l && l.length() == 4 && l.slots().empty() && l.runs().size() == 2);
      CHECK(l.runs()[1].start == 200 && l.runs()[1].len == 1);
      CHECK(c.stats().protected_tokens == 4);
      rkv::Lock moved_lock = std::move(l);
      CHECK(moved_lock.runs().size() == 2 && l.runs().empty());  // NOLINT(bugprone-use-after-move)
    }  // released by the destructor
    CHECK(c.stats().protected_tokens == 0);
    CHECK(c.evict(SIZE_MAX, [](const std::uint32_t *, std::size_t) {}) == 5);
  }
  {
    // evict_runs: slots 10..13 come back as one run, another leaf's scattered slots as runs
    // of one; an exception from the callback comes out after the eviction.
    CHECK(c.insert(0, toks, slots) == 0);
    CHECK(c.insert(0, std::vector<std::uint32_t>{7, 8, 9}, std::vector<std::uint32_t>{30, 20, 40}) == 0);
    std::vector<rkv_slot_run> got;
    std::size_t n = c.evict_runs(SIZE_MAX, [&got](const rkv_slot_run *r, std::size_t k) {
      got.insert(got.end(), r, r + k);
    });
    CHECK(n == 7 && got.size() == 4);
    std::vector<std::uint32_t> all;
    for (const rkv_slot_run &r : got)
      for (std::uint32_t i = 0; i < r.len; ++i) all.push_back(r.start + i);
    std::sort(all.begin(), all.end());
    CHECK((all == std::vector<std::uint32_t>{10, 11, 12, 13, 20, 30, 40}));
    CHECK(std::any_of(got.begin(), got.end(),
                      [](const rkv_slot_run &r) { return r.start == 10 && r.len == 4; }));
    CHECK(c.insert(0, toks, slots) == 0);
    bool threw_runs = false;
    try {
      c.evict_runs(1, [](const rkv_slot_run *, std::size_t) { throw std::runtime_error("boom"); });
    } catch (const std::runtime_error &e) {
      threw_runs = std::string(e.what()) == "boom";
    }
    CHECK(threw_runs && c.stats().cached_tokens == 0);
    // reclaim frees unlinked memory only: the counters stay.
    const std::uint64_t evicted = c.stats().evicted_tokens;
    c.reclaim();
    CHECK(c.stats().evicted_tokens == evicted && c.stats().nodes == 0);
  }
  rkv::Cache moved = std::move(c);
  CHECK_THROWS(c.stats(), RKV_NULL_ARGUMENT);  // NOLINT(bugprone-use-after-move)
  CHECK_THROWS(c.reclaim(), RKV_NULL_ARGUMENT);  // NOLINT(bugprone-use-after-move)
  CHECK(moved.stats().cached_tokens == 0);
}

void pooled_pages() {
  rkv::Cache c(rkv::Options{16, rkv::Policy::fifo, 256});
  CHECK(c.stats().pool_slots == 256 && c.stats().free_slots == 256);
  std::vector<std::uint32_t> toks(40);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(i * 3 + 1);
  std::vector<std::uint32_t> s = c.alloc(32);
  CHECK(s.size() == 32 && s[0] % 16 == 0 && s[16] % 16 == 0);
  CHECK_THROWS(c.alloc(5), RKV_INVALID_ARGUMENT);  // not whole pages
  CHECK(c.insert(0, std::vector<std::uint32_t>(toks.begin(), toks.begin() + 32), s) == 0);
  CHECK(c.match(0, toks) == s);
  CHECK_THROWS(c.free(s), RKV_DOUBLE_FREE);  // held by the tree
  CHECK_THROWS(c.alloc(272), RKV_OUT_OF_SLOTS);
  // An absurd size is refused as the C call would refuse it, before sizing the output
  // (it used to throw std::length_error from the vector).
  CHECK_THROWS(c.alloc(SIZE_MAX / 2), RKV_OUT_OF_SLOTS);
  CHECK_THROWS(rkv::Cache().alloc(SIZE_MAX / 2), RKV_NO_POOL);
  std::vector<std::uint32_t> all = c.alloc(256);  // evicts the cached 32
  CHECK(all.size() == 256 && c.stats().cached_tokens == 0 && c.stats().free_slots == 0);
  std::set<std::uint32_t> distinct(all.begin(), all.end());
  CHECK(distinct.size() == 256 && *distinct.rbegin() == 255);
  c.free(all);
  CHECK_THROWS(c.free(all), RKV_DOUBLE_FREE);
  CHECK(c.stats().free_slots == 256);
  // Slots as runs end to end: alloc_runs, insert_runs, free_runs.
  std::vector<rkv_slot_run> runs = c.alloc_runs(48);
  std::vector<std::uint32_t> got;
  for (const rkv_slot_run &r : runs)
    for (std::uint32_t i = 0; i < r.len; ++i) got.push_back(r.start + i);
  CHECK(got.size() == 48 && got[0] % 16 == 0 && c.stats().free_slots == 256 - 48);
  CHECK_THROWS(c.alloc_runs(5), RKV_INVALID_ARGUMENT);
  CHECK_THROWS(c.insert_runs(0, toks, runs), RKV_INVALID_ARGUMENT);  // 40 tokens, 48 slots
  std::vector<rkv_slot_run> first;
  std::size_t left = 40;
  for (rkv_slot_run r : runs) {
    if (left == 0) break;
    r.len = static_cast<std::uint32_t>(std::min<std::size_t>(r.len, left));
    left -= r.len;
    first.push_back(r);
  }
  CHECK(c.insert_runs(0, toks, first) == 0);  // 32 adopted, the unaligned 8 freed
  CHECK(c.stats().cached_tokens == 32 && c.stats().free_slots == 256 - 40);
  CHECK(c.match(0, toks) == std::vector<std::uint32_t>(got.begin(), got.begin() + 32));
  rkv_slot_run spare{got[40], 8};
  CHECK_THROWS(c.free_runs({rkv_slot_run{got[0], 1}}), RKV_DOUBLE_FREE);  // cached
  c.free_runs({spare});
  CHECK(c.stats().free_slots == 256 - 32);
  {
    std::vector<rkv_slot_run> more = c.alloc_runs(16);
    rkv::InsertLock il = c.insert_lock_runs(1, std::vector<std::uint32_t>(toks.begin(), toks.begin() + 16), more);
    CHECK(il.existing == 0 && il.lock.length() == 16 && c.stats().protected_tokens == 16);
  }
  CHECK(c.stats().protected_tokens == 0);
  rkv::Cache no_pool;
  CHECK_THROWS(no_pool.alloc_runs(1), RKV_NO_POOL);
  CHECK_THROWS(no_pool.free_runs({rkv_slot_run{0, 1}}), RKV_NO_POOL);
  CHECK_THROWS(rkv::Cache(rkv::Options{0, rkv::Policy::lru, 0}), RKV_INVALID_ARGUMENT);
  CHECK_THROWS(rkv::Cache(rkv::Options{16, rkv::Policy::lru, 100}), RKV_INVALID_ARGUMENT);
}

// rkv::Error::what() is the library's detailed message; status() stays the rkv_status.
void detailed_messages() {
  rkv::Cache c(rkv::Options{1, rkv::Policy::lru, 65536});
  std::vector<std::uint32_t> toks{1, 2, 3, 4};
  std::vector<std::uint32_t> s = c.alloc(3);
  s.push_back(70000);
  CHECK_WHAT(c.insert(0, toks, s), RKV_INVALID_ARGUMENT,
             "rkv_insert: slots[3] = 70000 is out of range: the pool has 65536 slots");
  s[3] = s[1];
  CHECK_WHAT(c.insert_lock(0, toks, s), RKV_INVALID_ARGUMENT, "is given twice (also slots[3]");
  CHECK_WHAT(c.insert(0, toks, std::vector<std::uint32_t>{1}), RKV_INVALID_ARGUMENT,
             "rkv_insert: 4 tokens but 1 slots");
  CHECK_WHAT(c.release(12345), RKV_INVALID_LOCK, "rkv_release: lock 0x3039");
  CHECK_WHAT(c.alloc(70000), RKV_OUT_OF_SLOTS,
             "rkv_alloc: n_slots = 70000 is more than the whole pool of 65536 slots");
  CHECK_WHAT(c.alloc(SIZE_MAX / 2), RKV_OUT_OF_SLOTS, "is more than the whole pool");
  CHECK_WHAT(rkv::Cache().alloc(1), RKV_NO_POOL, "rkv_alloc: this cache has no slot pool");
  CHECK_WHAT(rkv::Cache().evict(1), RKV_NULL_ARGUMENT, "rkv_evict: free_fn is NULL");
  CHECK_WHAT(rkv::Cache(rkv::Options{16, rkv::Policy::lru, 100}), RKV_INVALID_ARGUMENT,
             "opts->pool_slots = 100 is not a multiple of opts->page_size = 16");
  c.free(std::vector<std::uint32_t>(s.begin(), s.begin() + 3));
  CHECK_WHAT(c.free(std::vector<std::uint32_t>{s[0]}), RKV_DOUBLE_FREE,
             "rkv_free: slots[0] = ");
  try {
    c.free(std::vector<std::uint32_t>{s[0]});
  } catch (const rkv::Error &e) {
    CHECK(std::string(e.what()).find("is free, not held by the caller") != std::string::npos);
    CHECK(e.status() == RKV_DOUBLE_FREE);
  }
}

// drop_namespace, namespace_stats, namespace_count.
void namespaces() {
  std::vector<std::uint32_t> toks{1, 2, 3, 4, 5, 6};
  {
    rkv::Cache c;  // caller-managed
    std::vector<std::uint32_t> s1{10, 11, 12, 13, 14, 15}, s2{20, 21, 22, 23, 24, 25};
    CHECK(c.namespace_count() == 0);
    c.insert(1, toks, s1);
    c.insert(2, toks, s2);
    CHECK(c.namespace_count() == 2);
    rkv::NamespaceStats ns = c.namespace_stats(1);
    CHECK(ns.cached_tokens == 6 && ns.evictable_tokens == 6 && ns.protected_tokens == 0);
    CHECK(ns.nodes == 1);
    CHECK_THROWS(c.drop_namespace(1), RKV_NULL_ARGUMENT);  // no pool: a callback is required
    std::vector<std::uint32_t> freed;
    auto keep = [&freed](const std::uint32_t *s, std::size_t k) {
      freed.insert(freed.end(), s, s + k);
    };
    {
      rkv::Lock l = c.match_lock(1, std::vector<std::uint32_t>{1, 2, 3});
      CHECK(l.length() == 3);
      CHECK(c.drop_namespace(1, keep) == 3);  // the pinned 3 stay
      std::sort(freed.begin(), freed.end());
      CHECK(freed == (std::vector<std::uint32_t>{13, 14, 15}));
      ns = c.namespace_stats(1);
      CHECK(ns.cached_tokens == 3 && ns.protected_tokens == 3 && ns.evictable_tokens == 0);
      CHECK(c.namespace_stats(2).cached_tokens == 6);
    }
    CHECK(c.drop_namespace(1, keep) == 3);
    CHECK(freed.size() == 6 && c.namespace_count() == 1);
    CHECK(c.namespace_stats(1).cached_tokens == 0 && c.namespace_stats(1).nodes == 0);
    CHECK(c.drop_namespace(99, keep) == 0);  // unknown: 0, not an error
    CHECK(c.namespace_stats(99).cached_tokens == 0);
    // An exception from the callback comes out after the drop completes.
    bool threw = false;
    try {
      c.drop_namespace(2, [](const std::uint32_t *, std::size_t) { throw std::runtime_error("x"); });
    } catch (const std::runtime_error &) {
      threw = true;
    }
    CHECK(threw && c.namespace_count() == 0 && c.stats().cached_tokens == 0);
  }
  {
    rkv::Cache c(rkv::Options{1, rkv::Policy::lru, 64});
    std::vector<std::uint32_t> s = c.alloc(6);
    c.insert(7, toks, s);
    CHECK(c.namespace_count() == 1 && c.stats().free_slots == 58);
    CHECK(c.drop_namespace(7) == 6);  // pool mode: back to the pool
    CHECK(c.namespace_count() == 0 && c.stats().free_slots == 64);
    CHECK(c.drop_namespace(7) == 0);
  }
  CHECK_WHAT(rkv::Cache().drop_namespace(0), RKV_NULL_ARGUMENT,
             "rkv_drop_namespace: free_fn is NULL");
}

// Every eviction policy, the SLRU threshold, and the insert overloads taking a priority.
void policies() {
  const char *names[] = {"lru", "fifo", "lfu", "mru", "filo", "priority", "slru"};
  const rkv::Policy all[] = {rkv::Policy::lru,  rkv::Policy::fifo,     rkv::Policy::lfu,
                             rkv::Policy::mru,  rkv::Policy::filo,     rkv::Policy::priority,
                             rkv::Policy::slru};
  for (std::uint32_t i = 0; i < 7; ++i) {
    CHECK(static_cast<std::uint32_t>(all[i]) == i);
    CHECK(rkv::policy_name(all[i]) == names[i]);
    CHECK(rkv::parse_policy(names[i]) == all[i]);
    rkv::Cache c(rkv::Options{1, all[i], 0});
    CHECK(c.policy() == all[i] && c.slru_threshold() == RKV_DEFAULT_SLRU_THRESHOLD);
  }
  CHECK(rkv::parse_policy("LFU") == rkv::Policy::lfu);
  CHECK_WHAT(rkv::parse_policy("tlru"), RKV_INVALID_ARGUMENT,
             "unknown eviction policy \"tlru\" (expected one of lru, lfu, fifo, mru, filo, "
             "priority, slru)");
  CHECK_THROWS(rkv::policy_name(static_cast<rkv::Policy>(7)), RKV_INVALID_ARGUMENT);
  CHECK_WHAT(rkv::Cache(rkv::Options{1, static_cast<rkv::Policy>(7), 0}), RKV_INVALID_ARGUMENT,
             "opts->eviction_policy = 7 is not an rkv_eviction_policy (0 = RKV_EVICT_LRU");
  {
    rkv::Cache c(rkv::Options{1, rkv::Policy::slru, 0, 5});
    CHECK(c.policy() == rkv::Policy::slru && c.slru_threshold() == 5);
    rkv::Cache d;
    CHECK(d.policy() == rkv::Policy::lru && d.slru_threshold() == 2);
  }

  using V = std::vector<std::uint32_t>;
  // Leaf `f`: tokens {f, f + 1}, slots {10 f, 10 f + 1}.
  auto toks = [](std::uint32_t f) { return V{f, f + 1}; };
  auto slots = [](std::uint32_t f) { return V{10 * f, 10 * f + 1}; };
  {
    rkv::Cache c(rkv::Options{1, rkv::Policy::priority, 0});
    CHECK(c.insert(0, toks(1), slots(1), {10}) == 0);
    CHECK(c.insert(0, toks(2), slots(2), {-1}) == 0);
    { auto r = c.insert_lock(0, toks(3), slots(3), {0}); CHECK(r.existing == 0 && r.lock.length() == 2); }
    c.insert(0, toks(4), slots(4));  // the plain overload: priority 0
    CHECK(c.evict_slots(1) == slots(2));  // -1
    CHECK(c.evict_slots(1) == slots(3));  // 0, older than 4
    CHECK(c.evict_slots(1) == slots(4));
    CHECK(c.evict_slots(1) == slots(1));
    // A priority outside int32_t, by every overload: nothing changes.
    const std::int64_t big = std::int64_t{1} << 31;
    CHECK_WHAT(c.insert(0, toks(1), slots(1), {big}), RKV_INVALID_ARGUMENT,
               "rkv_insert_ex: opts->priority 2147483648 out of range (expected -2147483648 to "
               "2147483647)");
    CHECK_WHAT(c.insert_lock(0, toks(1), slots(1), {-big - 1}), RKV_INVALID_ARGUMENT,
               "rkv_insert_lock_ex: opts->priority -2147483649 out of range");
    const std::vector<rkv_slot_run> runs{rkv_slot_run{10, 2}};
    CHECK_WHAT(c.insert_runs(0, toks(1), runs, {big}), RKV_INVALID_ARGUMENT,
               "rkv_insert_runs_ex: opts->priority");
    CHECK_WHAT(c.insert_lock_runs(0, toks(1), runs, {INT64_MIN}), RKV_INVALID_ARGUMENT,
               "rkv_insert_lock_runs_ex: opts->priority -9223372036854775808");
    CHECK_WHAT(c.insert(0, toks(1), V{10}, {1}), RKV_INVALID_ARGUMENT,
               "rkv_insert_ex: 2 tokens but 1 slots");
    CHECK(c.stats().cached_tokens == 0 && c.stats().protected_tokens == 0);
  }
  {
    rkv::Cache c(rkv::Options{1, rkv::Policy::mru, 0});
    c.insert(0, toks(1), slots(1));
    c.insert(0, toks(2), slots(2));
    CHECK(c.match(0, toks(1)) == slots(1));
    CHECK(c.evict_slots(1) == slots(1));  // the most recent
  }
  {
    rkv::Cache c(rkv::Options{1, rkv::Policy::lfu, 0});
    c.insert(0, toks(1), slots(1));
    c.insert(0, toks(2), slots(2));
    c.insert(0, toks(1), slots(1));  // a second hit on 1
    c.insert(0, toks(2), slots(2), {0, /*inserted_len=*/2});  // the same request: no hit
    CHECK(c.evict_slots(1) == slots(2));  // the least hit
  }
  {
    // Pool mode: the runs overloads carry the priority; an eviction into the pool follows it.
    rkv::Cache c(rkv::Options{1, rkv::Policy::priority, 8});
    const V a{1, 2, 3, 4}, b{5, 6, 7, 8};
    CHECK(c.insert_runs(0, a, c.alloc_runs(4), {5}) == 0);
    {
      auto r = c.insert_lock_runs(0, b, c.alloc_runs(4), {1});
      CHECK(r.existing == 0 && r.lock.length() == 4 && c.stats().protected_tokens == 4);
    }
    CHECK(c.match_len(0, b) == 4);  // b is the most recent, of the lower priority
    CHECK(c.evict(1) == 4);
    CHECK(c.match_len(0, b) == 0 && c.match_len(0, a) == 4 && c.stats().free_slots == 4);
  }
}

}  // namespace

void api_tests() {
  CHECK(rkv::abi_version() == 1 && !rkv::version().empty());
  caller_managed();
  pooled_pages();
  detailed_messages();
  namespaces();
  policies();
}
