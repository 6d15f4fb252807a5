// rkv::TieredCache (the host tier) through the C++ wrapper: the write_through cycle with
// the tier's own host stores (bytes come back after a device eviction and a load-back),
// RAII of TierLock and LoadResult, refusals as rkv::Error, a TierLock outliving its tier.
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

}  // namespace

void tier_tests() {
  cycle();
  refusals_and_lifetime();
}
