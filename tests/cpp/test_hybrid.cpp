// rkv::HybridTree (the hybrid tree, rkv_hybrid_*): request cycles on an SWA + Mamba tree
// with the SWA rebuilds stored from the action callback, an eviction per component, no
// index lost (every index handed in is held or freed exactly once), RAII locks (moves, a
// lock outliving its tree, release twice), exceptions from callbacks, bad inputs, threads.
#include <cstdint>
#include <map>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "check.hpp"
#include "radixkv.hpp"

namespace {

/// The caller's books: each index handed in, and how often each component freed it.
struct Books {
  std::map<std::int64_t, int> full;   // FULL index -> 1 held, 2 freed
  std::map<std::int64_t, int> swa;    // FULL index -> 1 an SWA slot is live
  std::map<std::int64_t, int> mamba;  // state -> 1 held, 2 freed
  int bad = 0;
  void free(rkv::Component c, const std::int64_t *v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      auto &m = c == rkv::Component::full ? full : c == rkv::Component::swa ? swa : mamba;
      auto it = m.find(v[i]);
      if (it == m.end() || it->second != 1) {
        ++bad;
        continue;
      }
      if (c == rkv::Component::swa) m.erase(it);
      else it->second = 2;
    }
  }
  std::size_t held(const std::map<std::int64_t, int> &m) const {
    std::size_t k = 0;
    for (const auto &e : m) k += e.second == 1;
    return k;
  }
};

void cycles_lose_no_index() {
  rkv::HybridTree t(rkv::HybridOptions{/*page_size=*/2, /*swa_window=*/4, /*mamba=*/true});
  Books b;
  std::int64_t next_full = 0, next_state = 1000000;
  auto on_free = [&b](rkv::Component c, const std::int64_t *v, std::size_t n) { b.free(c, v, n); };
  auto on_action = [&](const rkv::HybridAction &a) {
    switch (a.kind) {
      case rkv::ActionKind::free_device_kv:
        for (std::int64_t f : a.a) {
          b.swa.erase(f);
          b.free(rkv::Component::full, &f, 1);
        }
        break;
      case rkv::ActionKind::free_device_kv_full_only:
        b.free(rkv::Component::full, a.a.data, a.a.size);
        break;
      case rkv::ActionKind::recover_swa_with_locked_full:
        b.free(rkv::Component::full, a.b.data, a.b.size);
        [[fallthrough]];
      case rkv::ActionKind::swa_rebuild: {
        std::vector<std::int64_t> swa;
        for (std::int64_t f : a.a) {
          swa.push_back(f + 50000);
          b.swa[f] = 1;
        }
        t.swa_set_value(a.node, swa);  // the tree's mutex is released during actions
        break;
      }
    }
  };
  for (int r = 0; r < 40; ++r) {
    std::vector<std::int64_t> key;
    for (int i = 0; i < 16 + 2 * (r % 5); ++i) key.push_back(i < 10 ? (r % 2) * 1000 + i : r * 100 + i);
    rkv::HybridMatchLock m = t.match_lock(0, key);
    std::vector<std::int64_t> vals = t.collect(m.match.last_device_node);
    CHECK(vals.size() == m.match.device_prefix_len);
    while (vals.size() < key.size()) {
      b.full[next_full] = 1;
      vals.push_back(next_full++);
    }
    std::int64_t state = next_state++;
    b.mamba[state] = 1;
    rkv::HybridInsertArgs args;
    args.prev_prefix_len = m.match.device_prefix_len;
    args.mamba_state = rkv::I64Span(&state, 1);
    args.lock = true;
    rkv::HybridInsert ins = t.insert(0, key, vals, on_action, args);
    CHECK(ins.lock && ins.lock.node() == ins.node);
    if (ins.mamba_exist) b.free(rkv::Component::mamba, &state, 1);
    if (r % 3 == 1) m.lock.release_window(on_free);
    m.lock.release();
    CHECK(!m.lock);
    CHECK_THROWS(m.lock.release(), RKV_INVALID_LOCK);
    // ins.lock releases itself here.
    if (r % 4 == 3) {
      t.evict(rkv::Component::mamba, 2, on_free);
      t.evict(rkv::Component::swa, 6, on_free);
      t.evict(rkv::Component::full, 8, on_free);
    }
  }
  t.check();
  rkv::HybridSizes s = t.sizes();
  CHECK(s.full_protected == 0 && s.swa_protected == 0 && s.mamba_protected == 0);
  CHECK(s.full_evictable == b.held(b.full));
  CHECK(s.swa_evictable == b.held(b.swa));
  CHECK(s.mamba_evictable == b.held(b.mamba));
  t.reset(on_free);
  CHECK(b.held(b.full) == 0 && b.swa.empty() && b.held(b.mamba) == 0);
  CHECK(b.full.size() == static_cast<std::size_t>(next_full));
  CHECK(b.bad == 0);
  t.check();
}

void locks_are_raii() {
  rkv::HybridTree t(rkv::HybridOptions{1, 2, true});
  auto nothing = [](const rkv::HybridAction &a) {
    if (a.kind != rkv::ActionKind::swa_rebuild) throw std::logic_error("unexpected action");
  };
  std::vector<std::int64_t> key{1, 2, 3}, vals{11, 12, 13}, st{5};
  rkv::HybridInsertArgs args;
  args.mamba_state = st;
  args.refresh = false;  // the values are not rebuilt here: no refresh
  rkv::HybridInsert ins = t.insert(0, key, vals, nothing, args);
  CHECK(!ins.refreshed && !ins.mamba_exist && !ins.lock);
  {
    rkv::HybridLock a = t.lock(ins.node);
    CHECK(t.sizes().full_protected == 3 && t.sizes().mamba_protected == 1);
    rkv::HybridLock b = std::move(a);
    CHECK(!a && b);
    CHECK_THROWS(a.release(), RKV_INVALID_LOCK);
  }  // b releases itself
  CHECK(t.sizes().full_protected == 0 && t.sizes().mamba_protected == 0);
  // A lock that outlives its tree releases nothing.
  rkv::HybridLock late;
  {
    rkv::HybridTree t2;
    rkv::HybridInsert i2 = t2.insert(0, key, vals, nothing);
    late = t2.lock(i2.node);
  }
  CHECK(late);
  CHECK_THROWS(late.release(), RKV_INVALID_LOCK);
  // Reset invalidates locks.
  rkv::HybridLock c = t.lock(ins.node);
  t.reset();
  CHECK_THROWS(c.release(), RKV_INVALID_LOCK);
  t.check();
}

void callback_exceptions_lose_nothing() {
  rkv::HybridTree t(rkv::HybridOptions{1, 0, false});
  std::vector<std::int64_t> key{1, 2, 3, 4}, a{1, 2, 3, 4}, b{5, 6, 7, 8};
  auto none = [](const rkv::HybridAction &) {};
  t.insert(0, key, a, none);
  std::vector<std::int64_t> got;
  bool threw = false;
  try {
    t.insert(0, key, b, [&got](const rkv::HybridAction &x) {
      got.insert(got.end(), x.a.begin(), x.a.end());
      throw std::runtime_error("callback failed");
    });
  } catch (const std::runtime_error &e) {
    threw = std::string(e.what()) == "callback failed";
  }
  CHECK(threw && got == b);  // the duplicates reached the callback before the rethrow
  std::vector<std::int64_t> freed;
  int calls = 0;
  threw = false;
  try {
    t.evict(rkv::Component::full, 100, [&](rkv::Component c, const std::int64_t *v, std::size_t n) {
      CHECK(c == rkv::Component::full);
      freed.insert(freed.end(), v, v + n);
      if (++calls == 1) throw std::runtime_error("free failed");
    });
  } catch (const std::runtime_error &) {
    threw = true;
  }
  CHECK(threw && freed == a);
  CHECK(t.sizes().full_evictable == 0);
}

void bad_inputs() {
  CHECK_THROWS(rkv::HybridTree(rkv::HybridOptions{0, 0, false}), RKV_INVALID_ARGUMENT);
  rkv::HybridTree t;
  auto none = [](const rkv::HybridAction &) {};
  auto drop = [](rkv::Component, const std::int64_t *, std::size_t) {};
  std::vector<std::int64_t> key{1, 2, 3, 4}, shrt{1, 2};
  CHECK_WHAT(t.insert(0, key, shrt, none), RKV_INVALID_ARGUMENT, "values has 2 indices");
  CHECK_WHAT(t.evict(rkv::Component::swa, 1, drop), RKV_INVALID_ARGUMENT, "no such component");
  CHECK_THROWS(t.evict(rkv::Component::mamba, 1, drop), RKV_INVALID_ARGUMENT);
  CHECK_THROWS(t.lock(987654), RKV_INVALID_ARGUMENT);
  CHECK_THROWS(t.collect(987654), RKV_INVALID_ARGUMENT);
  CHECK_THROWS(t.swa_set_value(t.root(), key), RKV_INVALID_ARGUMENT);
  rkv::HybridInsertArgs args;
  args.mamba_state = key;
  CHECK_WHAT(t.insert(0, key, key, none, args), RKV_INVALID_ARGUMENT, "no Mamba component");
  rkv::HybridTree moved = std::move(t);
  CHECK(!t && moved);
  CHECK_THROWS(t.sizes(), RKV_NULL_ARGUMENT);
  moved.check();
}

void threads_share_a_tree() {
  rkv::HybridTree t(rkv::HybridOptions{1, 3, true});
  std::vector<std::thread> ts;
  for (int th = 0; th < 4; ++th) {
    ts.emplace_back([&t, th] {
      auto drop = [](rkv::Component, const std::int64_t *, std::size_t) {};
      for (int i = 0; i < 100; ++i) {
        std::vector<std::int64_t> key;
        for (int k = 0; k < 6; ++k) key.push_back(th * 1000 + (i % 7) * 10 + k);
        rkv::HybridMatchLock m = t.match_lock(0, key);
        std::vector<std::int64_t> vals = t.collect(m.match.last_device_node);
        for (std::size_t k = vals.size(); k < key.size(); ++k) vals.push_back(i * 100000 + th * 100 + static_cast<std::int64_t>(k));
        std::int64_t st = th * 100000 + i;
        rkv::HybridInsertArgs args;
        args.prev_prefix_len = m.match.device_prefix_len;
        args.mamba_state = rkv::I64Span(&st, 1);
        args.lock = true;
        rkv::HybridInsert ins = t.insert(0, key, vals, [&t](const rkv::HybridAction &a) {
          if (a.kind == rkv::ActionKind::swa_rebuild) t.swa_set_value(a.node, a.a);
        }, args);
        if (i % 5 == 0) t.evict(rkv::Component::full, 6, drop);
        if (i % 7 == 0) t.evict(rkv::Component::swa, 3, drop);
      }
    });
  }
  for (auto &x : ts) x.join();
  t.check();
}

/// A sliding window in the lock-free cache (Options::swa_window, Cache::evict_kv): a
/// tombstone, SWA-valid matches, the reports, a throwing callback, the pool refilled.
void a_window_cache_reports_what_it_frees() {
  rkv::Options o;
  o.pool_slots = 16;
  o.swa_window = 2;
  rkv::Cache c(o);
  std::vector<std::uint32_t> s = c.alloc(6);
  const std::vector<std::uint32_t> a{1, 2, 3, 4}, b{1, 2, 3, 4, 5, 6};
  CHECK(c.insert(0, b, s) == 0);
  { rkv::Lock split = c.match_lock(0, a); }  // splits [1..6] at 4
  rkv::Lock held = c.match_lock(0, b);       // holds [5, 6]'s window
  CHECK(held.length() == 6);
  std::vector<std::pair<int, std::uint32_t>> got;  // (full * 2 + swa, first slot)
  auto rec = [&got](bool full, bool swa, const std::uint32_t *xs, std::size_t) {
    got.emplace_back(full * 2 + swa, xs[0]);
  };
  CHECK(c.evict_kv(rkv::EvictTarget::swa, 1, rec) == 4);
  CHECK(got.size() == 1 && got[0] == std::make_pair(1, s[0]));
  CHECK(c.match_lock(0, a).length() == 0);  // ends on the tombstone: not valid
  CHECK(c.match_lock(0, b).length() == 6);
  bool threw = false;
  try {
    c.evict(1);  // no callback with a window: refused
  } catch (const rkv::Error &e) {
    threw = e.status() == RKV_INVALID_ARGUMENT;
  }
  CHECK(threw);
  held = rkv::Lock();
  threw = false;
  std::size_t calls = 0;
  try {
    c.evict_kv(rkv::EvictTarget::full, 100, [&calls](bool, bool, const std::uint32_t *, std::size_t) {
      ++calls;
      throw std::runtime_error("engine bug");
    });
  } catch (const std::runtime_error &) {
    threw = true;
  }
  CHECK(threw && calls == 2);  // the eviction went on: both nodes freed
  CHECK(c.stats().cached_tokens == 0 && c.alloc(16).size() == 16);
}

}  // namespace

void hybrid_tests() {
  a_window_cache_reports_what_it_frees();
  cycles_lose_no_index();
  locks_are_raii();
  callback_exceptions_lose_nothing();
  bad_inputs();
  threads_share_a_tree();
}
