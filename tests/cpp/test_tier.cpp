// rkv::TieredCache (the host tier) through the C++ wrapper: the write_through cycle with
// the tier's own host stores (bytes come back after a device eviction and a load-back),
// RAII of TierLock and LoadResult, refusals as rkv::Error, a TierLock outliving its tier.
// And the same tier on an rkv::Cache made with rkv::HostOptions (rkv_cache_new_host):
// lookup / lookup_lock with host_len, load_back / load_wait / load_poll, evict_host,
// tier_stats, its Locks, and every refusal (also on a Cache without a tier).
#include <cstring>
#include <vector>

#include "check.hpp"
#include "radixkv.hpp"

namespace {

constexpr std::uint32_t kPage = 4;
constexpr std::size_t kSlotBytes = 8;  // 1 head x 2 dims x 4 bytes

rkv::TierOptions host_tier(rkv::WritePolicy w) {
  rkv::TierOptions o;
  o.page_size = kPage;
  o.pool_slots = 32;
  o.host_slots = 64;
  o.write_policy = w;
  o.copier = rkv::CopierKind::host;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 2;
  o.elem_bytes = 4;
  return o;
}

unsigned char byte_of(std::uint32_t tok, int v) { return static_cast<unsigned char>(tok * 3 + v); }

void cycle() {
  rkv::TieredCache t(host_tier(rkv::WritePolicy::write_through));
  std::vector<std::uint32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8};
  auto kv = t.kv(RKV_SIDE_DEVICE, 0);
  auto *k = static_cast<unsigned char *>(kv.first);
  auto *v = static_cast<unsigned char *>(kv.second);
  {
    rkv::TierMatch m = t.match_lock(0, toks);
    CHECK(m.slots.empty() && m.host_len == 0 && m.lock);
    std::vector<std::uint32_t> slots = t.alloc(8);
    for (std::size_t i = 0; i < 8; ++i) {
      std::memset(k + slots[i] * kSlotBytes, byte_of(toks[i], 0), kSlotBytes);
      std::memset(v + slots[i] * kSlotBytes, byte_of(toks[i], 1), kSlotBytes);
    }
    CHECK(t.insert(0, toks, slots) == 0);
  }  // the TierLock releases itself
  CHECK(t.stats().tokens_to_host == 8);
  CHECK(t.stats().device.protected_tokens == 0);
  CHECK(t.evict(8) == 8);
  std::memset(k, 0, 32 * kSlotBytes);
  std::memset(v, 0, 32 * kSlotBytes);
  rkv::TierMatch m = t.match(0, toks);
  CHECK(m.slots.empty() && m.host_len == 8 && !m.lock);
  std::uint64_t ticket = t.load_back(0, toks);
  {
    rkv::LoadResult r;
    CHECK(t.load_poll(ticket, r));
    CHECK(r.lock && r.lock.length() == 8 && r.loaded == 8 && r.device_len == 0);
    CHECK(r.outcome == RKV_LOAD_LOADED && r.slots.size() == 8);
    bool same = true;
    for (std::size_t i = 0; i < 8; ++i)
      for (std::size_t b = 0; b < kSlotBytes; ++b)
        same = same && k[r.slots[i] * kSlotBytes + b] == byte_of(toks[i], 0) &&
               v[r.slots[i] * kSlotBytes + b] == byte_of(toks[i], 1);
    CHECK(same);
    CHECK(t.stats().device.protected_tokens == 8);
  }
  CHECK(t.stats().device.protected_tokens == 0);
  CHECK_THROWS(t.load_wait(ticket), RKV_INVALID_ARGUMENT);  // taken
  t.wait_all();
  CHECK(t.poll() == 0);
  t.check();
  CHECK(t.evict(8) == 8);
  CHECK(t.evict_host(8) == 8);
  CHECK(t.stats().host_free_slots == 64);
}

void refusals_and_lifetime() {
  rkv::TierOptions bad = host_tier(rkv::WritePolicy::write_back);
  bad.pool_slots = 0;
  CHECK_THROWS(rkv::TieredCache{bad}, RKV_INVALID_ARGUMENT);
  bad = host_tier(rkv::WritePolicy::write_back);
  bad.host_slots = 6;
  CHECK_THROWS(rkv::TieredCache{bad}, RKV_INVALID_ARGUMENT);
  rkv::TierOptions none;
  none.page_size = kPage;
  none.pool_slots = 32;
  none.host_slots = 32;
  rkv::TierLock outlives;
  {
    rkv::TieredCache t(none);
    CHECK_THROWS(t.kv(RKV_SIDE_HOST, 0), RKV_INVALID_ARGUMENT);
    CHECK_THROWS(t.alloc(3), RKV_INVALID_ARGUMENT);
    std::vector<std::uint32_t> toks = {1, 2, 3, 4};
    std::vector<std::uint32_t> slots = t.alloc(4);
    CHECK_THROWS(t.insert(0, toks, std::vector<std::uint32_t>{1}), RKV_INVALID_ARGUMENT);
    CHECK(t.insert(0, toks, slots) == 0);
    rkv::TierMatch m = t.match_lock(0, toks);
    CHECK(m.lock.length() == 4);
    outlives = std::move(m.lock);
    CHECK(outlives && !m.lock);
    CHECK_THROWS(t.load_wait(987654), RKV_INVALID_ARGUMENT);
    // A load-back never taken: the tier's destructor releases it.
    (void)t.load_back(0, toks);
  }
  CHECK(!outlives);
  CHECK_THROWS(outlives.release(), RKV_INVALID_LOCK);
}

rkv::Options dev_options() {
  rkv::Options o;
  o.page_size = kPage;
  o.pool_slots = 16;
  return o;
}

rkv::HostOptions write_through() {
  rkv::HostOptions h;
  h.host_slots = 32;
  h.write_policy = rkv::WritePolicy::write_through;
  return h;
}

void host_tier_through_cache() {
  rkv::Cache c(dev_options(), write_through());
  std::vector<std::uint32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8};
  {
    rkv::Lookup m = c.lookup_lock(0, toks);
    CHECK(m.device_len() == 0 && m.host_len == 0 && m.lock && m.lock.length() == 0);
    std::vector<std::uint32_t> slots = c.alloc(8);
    CHECK(c.insert(0, toks, slots) == 0);
  }  // the Lock releases itself
  c.wait_all();
  CHECK(c.tier_stats().host_backed_slots == 8);
  CHECK(c.evict(8) == 8);
  rkv::Lookup m = c.lookup(0, toks);
  CHECK(m.device_len() == 0 && m.host_len == 8 && !m.lock);
  rkv::Loaded l = c.load_wait(c.load_back(0, toks));
  CHECK(l.outcome == RKV_LOAD_LOADED && l.device_len == 0 && l.loaded == 8);
  CHECK(l.lock && l.lock.length() == 8 && l.slots.size() == 8);
  CHECK(c.stats().protected_tokens == 8);
  m = c.lookup(0, toks);
  CHECK(m.device_len() == 8 && m.host_len == 0 && m.slots == l.slots);
  l.lock.release();
  CHECK(c.stats().protected_tokens == 0);
  CHECK_THROWS(l.lock.release(), RKV_INVALID_LOCK);
  // Poll, half of it; then host eviction of the page only the host holds.
  CHECK(c.evict(8) == 8);
  rkv::Loaded half;
  CHECK(c.load_poll(c.load_back(0, toks, 4), half));
  CHECK(half.loaded == 4 && half.lock.length() == 4);
  half = rkv::Loaded{};  // releases its lock
  CHECK(c.stats().protected_tokens == 0);
  CHECK(c.evict_host(SIZE_MAX) == 4);
  m = c.lookup(0, toks);
  CHECK(m.device_len() == 4 && m.host_len == 0);
  CHECK(c.tier_stats().load_backs == 2);
  // A ticket taken twice, an unknown one, a load-back the device cannot hold.
  std::uint64_t t = c.load_back(0, toks);
  c.load_wait(t).lock.release();
  CHECK_THROWS(c.load_wait(t), RKV_INVALID_ARGUMENT);
  rkv::Loaded untouched;
  CHECK_THROWS(c.load_poll(424242, untouched), RKV_INVALID_ARGUMENT);
  CHECK(!untouched.lock && untouched.slots.empty());
  // An empty query matches nothing, with a lock all the same.
  rkv::Lookup none = c.lookup_lock(0, std::vector<std::uint32_t>{});
  CHECK(none.device_len() == 0 && none.lock);
}

void host_tier_refusals() {
  rkv::Options no_pool = dev_options();
  no_pool.pool_slots = 0;
  CHECK_THROWS((rkv::Cache{no_pool, write_through()}), RKV_INVALID_ARGUMENT);
  rkv::HostOptions odd = write_through();
  odd.host_slots = 6;
  CHECK_THROWS((rkv::Cache{dev_options(), odd}), RKV_INVALID_ARGUMENT);
  rkv::HostOptions bad_policy = write_through();
  bad_policy.write_policy = static_cast<rkv::WritePolicy>(9);
  CHECK_THROWS((rkv::Cache{dev_options(), bad_policy}), RKV_INVALID_ARGUMENT);
  rkv::HostOptions no_callbacks = write_through();
  no_callbacks.copier = rkv::CopierKind::callback;
  CHECK_THROWS((rkv::Cache{dev_options(), no_callbacks}), RKV_NULL_ARGUMENT);  // callbacks.to_host
  // Without a tier: lookup answers host_len 0; the tier's own calls are refused.
  rkv::Cache plain(dev_options());
  std::vector<std::uint32_t> toks = {1, 2, 3, 4};
  CHECK(plain.insert(0, toks, plain.alloc(4)) == 0);
  rkv::Lookup m = plain.lookup(0, toks);
  CHECK(m.device_len() == 4 && m.host_len == 0);
  CHECK_THROWS(plain.load_back(0, toks), RKV_INVALID_ARGUMENT);
  CHECK_THROWS(plain.load_wait(1), RKV_INVALID_ARGUMENT);
  CHECK_THROWS(plain.evict_host(4), RKV_INVALID_ARGUMENT);
  CHECK_THROWS(plain.tier_stats(), RKV_INVALID_ARGUMENT);
  plain.wait_all();  // nothing in flight: nothing to do
  try {
    (void)plain.load_back(0, toks);
  } catch (const rkv::Error &e) {
    CHECK(std::strstr(e.what(), "rkv_cache_load_back: this cache has no host tier") != nullptr);
  }
  CHECK(plain.stats().cached_tokens == 4 && plain.stats().free_slots == 12);
  // A Lock and a load-back never taken outliving their Cache.
  rkv::Lock outlives;
  {
    rkv::Cache c(dev_options(), write_through());
    CHECK(c.insert(0, toks, c.alloc(4)) == 0);
    outlives = std::move(c.lookup_lock(0, toks).lock);
    CHECK(outlives && outlives.length() == 4);
    c.wait_all();
    (void)c.load_back(0, toks);
  }
  CHECK(!outlives);
  CHECK_THROWS(outlives.release(), RKV_INVALID_LOCK);
}

}  // namespace

void tier_tests() {
  cycle();
  refusals_and_lifetime();
  host_tier_through_cache();
  host_tier_refusals();
}
