// radixkv C++17 bindings, one piece of radixkv.hpp (include that one, not this): the host
// tier's own handle: TierOptions, TierLock, TierMatch, LoadResult and rkv::TieredCache.
// It includes what it needs, so it also compiles alone.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef RADIXKV_TIER_HPP
#define RADIXKV_TIER_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base.hpp"

namespace rkv {

// ---------------------------------------------------------------------------------------
// The host tier's own handle (rkv_tier_*): a device cache with its pool and a host pool
// behind it. A Cache made with HostOptions is the same cache behind the plain handle
// (Cache::lookup, load_back, load_wait, evict_host, tier_stats); TieredCache stays for
// code written against it.


/// Options of a TieredCache (rkv_options of the device cache, which needs a pool, and
/// rkv_tier_options).
struct TierOptions {
  std::uint32_t page_size = 1;
  Policy policy = Policy::lru;            ///< The device's eviction order.
  std::uint64_t pool_slots = 0;           ///< Device pool slots (required: > 0).
  std::uint64_t host_slots = 0;           ///< Host slots (required: a multiple of page_size).
  WritePolicy write_policy = WritePolicy::write_through_selective;
  std::uint32_t write_threshold = 2;      ///< write_through_selective's hit count.
  std::uint64_t load_back_min = 1;        ///< Shorter load-backs are not done.
  /// The host eviction order; RKV_HOST_POLICY_SAME_AS_DEVICE (the default) or a Policy.
  std::uint32_t host_policy = RKV_HOST_POLICY_SAME_AS_DEVICE;
  CopierKind copier = CopierKind::none;
  /// CopierKind::host's layout (per token and layer: num_kv_heads * head_dim elements).
  std::uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 0, elem_bytes = 0;
  /// CopierKind::callback's functions (see rkv_copier: thread-safe, valid until the
  /// TieredCache is destroyed, must not throw).
  rkv_copier callbacks{};
};


class TieredCache;

/// A pin on a prefix of a TieredCache's device cache, released by the destructor or by
/// release(). Move-only; like Lock, it may outlive its TieredCache safely (then it holds
/// nothing).
class TierLock {
 public:
  TierLock() noexcept = default;
  TierLock(const TierLock &) = delete;
  TierLock &operator=(const TierLock &) = delete;
  TierLock(TierLock &&o) noexcept
      : tier_(std::move(o.tier_)), handle_(std::exchange(o.handle_, 0)),
        length_(std::exchange(o.length_, 0)) {}
  TierLock &operator=(TierLock &&o) noexcept {
    if (this != &o) {
      drop();
      tier_ = std::move(o.tier_);
      handle_ = std::exchange(o.handle_, 0);
      length_ = std::exchange(o.length_, 0);
    }
    return *this;
  }
  ~TierLock() { drop(); }

  /// Whether it holds a pin.
  explicit operator bool() const noexcept { return handle_ != 0 && !tier_.expired(); }
  /// The raw handle (0 when empty).
  rkv_lock handle() const noexcept { return handle_; }
  /// Tokens pinned.
  std::size_t length() const noexcept { return length_; }
  /// Releases the pin now: Error(RKV_INVALID_LOCK) on an empty TierLock or one whose
  /// TieredCache was destroyed. Empty afterwards either way.
  void release() {
    if (handle_ == 0) {
      throw Error(RKV_INVALID_LOCK, std::string("rkv_tier_release: this rkv::TierLock is empty"));
    }
    std::shared_ptr<rkv_tier> t = std::exchange(tier_, {}).lock();
    rkv_lock h = std::exchange(handle_, 0);
    length_ = 0;
    if (!t) {
      throw Error(RKV_INVALID_LOCK, std::string("rkv_tier_release: the rkv::TieredCache of "
                                                "this lock was destroyed, which released it"));
    }
    detail::check(rkv_tier_release(t.get(), h), "rkv_tier_release");
  }

 private:
  friend class TieredCache;
  TierLock(std::weak_ptr<rkv_tier> t, rkv_lock h, std::size_t len) noexcept
      : tier_(std::move(t)), handle_(h), length_(len) {}
  void drop() noexcept {
    if (handle_ != 0) {
      if (std::shared_ptr<rkv_tier> t = tier_.lock()) (void)rkv_tier_release(t.get(), handle_);
    }
    tier_.reset();
    handle_ = 0;
  }
  std::weak_ptr<rkv_tier> tier_;
  rkv_lock handle_ = 0;
  std::size_t length_ = 0;
};

/// A match on both levels (TieredCache::match / match_lock).
struct TierMatch {
  std::vector<std::uint32_t> slots;  ///< The device prefix's slots.
  std::size_t host_len = 0;          ///< Host tokens right after it (host_hit_length).
  TierLock lock;                     ///< match_lock only: pins the device prefix.
};

/// A finished load-back (TieredCache::load_wait / load_poll).
struct LoadResult {
  TierLock lock;                     ///< Pins the device prefix with the loaded pages.
  std::vector<std::uint32_t> slots;  ///< Its slots.
  std::size_t device_len = 0;        ///< Tokens that were on the device before.
  std::size_t loaded = 0;            ///< Tokens loaded from the host.
  rkv_load_outcome outcome = RKV_LOAD_NOTHING_ON_HOST;
};

/// Owns an rkv_tier. Move-only; its const members are safe from many threads at once.
class TieredCache {
 public:
  explicit TieredCache(const TierOptions &o) {
    rkv_options d = rkv_options_default();
    d.page_size = o.page_size;
    d.eviction_policy = static_cast<std::uint32_t>(o.policy);
    d.pool_slots = o.pool_slots;
    rkv_tier_options t = rkv_tier_options_default();
    t.host_slots = o.host_slots;
    t.write_policy = static_cast<std::uint32_t>(o.write_policy);
    t.write_threshold = o.write_threshold;
    t.load_back_min = o.load_back_min;
    t.host_policy = o.host_policy;
    t.copier = static_cast<std::uint32_t>(o.copier);
    t.num_layers = o.num_layers;
    t.num_kv_heads = o.num_kv_heads;
    t.head_dim = o.head_dim;
    t.elem_bytes = o.elem_bytes;
    t.callbacks = o.callbacks;
    rkv_tier *raw = nullptr;
    detail::check(rkv_tier_new(&d, &t, &raw), "rkv_tier_new");
    owner_.reset(raw, rkv_tier_free);
    tier_ = raw;
  }
  TieredCache(const TieredCache &) = delete;
  TieredCache &operator=(const TieredCache &) = delete;
  TieredCache(TieredCache &&o) noexcept
      : owner_(std::move(o.owner_)), tier_(std::exchange(o.tier_, nullptr)) {}
  TieredCache &operator=(TieredCache &&o) noexcept {
    if (this != &o) {
      owner_ = std::move(o.owner_);
      tier_ = std::exchange(o.tier_, nullptr);
    }
    return *this;
  }
  /// Waits for copies in flight, frees the tier; TierLocks still around hold nothing.
  ~TieredCache() = default;

  /// The C handle, still owned by this object.
  const rkv_tier *get() const noexcept { return tier_; }

  /// The device prefix of `tokens` (pins nothing) and how far the host extends it.
  TierMatch match(std::uint64_t ns, Span tokens) const { return match_impl(ns, tokens, false); }
  /// match() pinning the device prefix (TierMatch::lock).
  TierMatch match_lock(std::uint64_t ns, Span tokens) const {
    return match_impl(ns, tokens, true);
  }

  /// `n` device slots (a multiple of the page size).
  std::vector<std::uint32_t> alloc(std::size_t n) const {
    std::vector<std::uint32_t> out(n);
    detail::check(rkv_tier_alloc(tier_, n, out.data()), "rkv_tier_alloc");
    return out;
  }
  /// Returns allocated, never inserted slots.
  void free(Span slots) const {
    detail::check(rkv_tier_free_slots(tier_, slots.data, slots.size), "rkv_tier_free_slots");
  }
  /// Inserts tokens with their slots (then backs pages up per the write policy); returns
  /// the tokens cached already.
  std::size_t insert(std::uint64_t ns, Span tokens, Span slots,
                     const InsertOptions &io = InsertOptions{}) const {
    if (tokens.size != slots.size) {
      throw Error(RKV_INVALID_ARGUMENT, "rkv_tier_insert_ex: " + std::to_string(tokens.size) +
                                            " tokens but " + std::to_string(slots.size) +
                                            " slots (one slot per token)");
    }
    rkv_insert_options o = rkv_insert_options_default();
    o.priority = io.priority;
    o.inserted_len = io.inserted_len;
    std::size_t existing = 0;
    detail::check(rkv_tier_insert_ex(tier_, ns, tokens.data, slots.data, tokens.size, &o,
                                     &existing),
                  "rkv_tier_insert_ex");
    return existing;
  }
  /// Evicts at least `n` device tokens (host copies stay); returns the tokens freed.
  std::size_t evict(std::size_t n) const {
    std::size_t k = 0;
    detail::check(rkv_tier_evict(tier_, n, &k), "rkv_tier_evict");
    return k;
  }
  /// Evicts at least `n` host tokens (host-only leaves); returns the host tokens freed.
  std::size_t evict_host(std::size_t n) const {
    std::size_t k = 0;
    detail::check(rkv_tier_evict_host(tier_, n, &k), "rkv_tier_evict_host");
    return k;
  }
  /// Starts loading back the host pages extending the device match (at most max_tokens);
  /// take the result once with load_wait or load_poll.
  std::uint64_t load_back(std::uint64_t ns, Span tokens,
                          std::size_t max_tokens = SIZE_MAX) const {
    std::uint64_t t = 0;
    detail::check(rkv_tier_load_back(tier_, ns, tokens.data, tokens.size, max_tokens, &t),
                  "rkv_tier_load_back");
    return t;
  }
  /// Waits for a load-back and takes its result (Error(RKV_DEVICE_ERROR) for a failed copy,
  /// rolled back; Error(RKV_INVALID_ARGUMENT) for an unknown or taken ticket).
  LoadResult load_wait(std::uint64_t ticket) const {
    LoadResult r;
    take(ticket, nullptr, r);
    return r;
  }
  /// Takes a load-back's result if it is done (true), else false.
  bool load_poll(std::uint64_t ticket, LoadResult &out) const {
    int done = 0;
    take(ticket, &done, out);
    return done != 0;
  }
  /// Finishes the copies that are done; returns how many.
  std::size_t poll() const {
    std::size_t n = 0;
    detail::check(rkv_tier_poll(tier_, &n), "rkv_tier_poll");
    return n;
  }
  /// Waits for every copy in flight.
  void wait_all() const { detail::check(rkv_tier_wait_all(tier_), "rkv_tier_wait_all"); }
  /// Counts and counters.
  TierStats stats() const {
    TierStats s{};
    detail::check(rkv_tier_get_stats(tier_, &s), "rkv_tier_get_stats");
    return s;
  }
  /// Throws rkv::Error saying which invariant fails (call at quiescence).
  void check() const { detail::check(rkv_tier_check(tier_), "rkv_tier_check"); }
  /// CopierKind::host: layer `layer`'s K and V base pointers of one store.
  std::pair<void *, void *> kv(rkv_tier_side side, std::uint32_t layer) const {
    void *k = nullptr, *v = nullptr;
    detail::check(rkv_tier_kv_ptr(tier_, static_cast<std::uint32_t>(side), layer, &k, &v),
                  "rkv_tier_kv_ptr");
    return {k, v};
  }

 private:
  TierMatch match_impl(std::uint64_t ns, Span tokens, bool pin) const {
    TierMatch m;
    m.slots.resize(tokens.size);
    std::size_t len = 0, host = 0;
    rkv_lock h = 0;
    detail::check(rkv_tier_match(tier_, ns, tokens.data, tokens.size, m.slots.data(),
                                 m.slots.size(), &len, &host, pin ? &h : nullptr),
                  "rkv_tier_match");
    m.slots.resize(len);
    m.host_len = host;
    if (pin) m.lock = TierLock(owner_, h, len);
    return m;
  }
  // Takes a result, growing the buffer when it did not fit (the tier keeps it meanwhile).
  void take(std::uint64_t ticket, int *done, LoadResult &out) const {
    std::vector<std::uint32_t> slots(64);
    for (;;) {
      std::size_t len = 0;
      rkv_load_result r{};
      rkv_status st =
          done ? rkv_tier_load_poll(tier_, ticket, slots.data(), slots.size(), &len, &r, done)
               : rkv_tier_load_wait(tier_, ticket, slots.data(), slots.size(), &len, &r);
      if (st == RKV_BUFFER_TOO_SMALL) {
        slots.resize(len);
        continue;
      }
      detail::check(st, done ? "rkv_tier_load_poll" : "rkv_tier_load_wait");
      if (done && *done == 0) return;
      slots.resize(len);
      out.lock = TierLock(owner_, r.lock, r.len);
      out.slots = std::move(slots);
      out.device_len = r.device_len;
      out.loaded = r.loaded;
      out.outcome = static_cast<rkv_load_outcome>(r.outcome);
      return;
    }
  }

  std::shared_ptr<rkv_tier> owner_;
  const rkv_tier *tier_ = nullptr;
};

}  // namespace rkv

#endif  // RADIXKV_TIER_HPP
