// radixkv C++17 bindings, one piece of radixkv.hpp (include that one, not this): rkv::Cache
// (the owner of an rkv_cache).
// It includes what it needs, so it also compiles alone.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef RADIXKV_CACHE_HPP
#define RADIXKV_CACHE_HPP

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base.hpp"
#include "events.hpp"
#include "lock.hpp"
#include "request.hpp"

namespace rkv {

/// Owns an rkv_cache. Move-only; its const members are safe from many threads at once.
class Cache {
 public:
  explicit Cache(const Options &o = Options{}) {
    rkv_options opts = rkv_options_default();
    opts.page_size = o.page_size;
    opts.eviction_policy = static_cast<std::uint32_t>(o.policy);
    opts.pool_slots = o.pool_slots;
    rkv_policy_options policy = rkv_policy_options_default();
    policy.slru_threshold = o.slru_threshold;
    policy.swa_window = o.swa_window;
    rkv_cache *raw = nullptr;
    detail::check(rkv_cache_new_with(&opts, &policy, &raw), "rkv_cache_new_with");
    owner_.reset(raw, rkv_cache_free);  // frees `raw` itself if it throws
    cache_ = raw;
  }
  /// A cache with a host tier behind its pool (rkv_cache_new_host): its inserts back pages
  /// up per h.write_policy, its evictions keep host copies, lookup() reports host_len and
  /// load_back() brings host pages back. Destroying it waits for the copies in flight.
  Cache(const Options &o, const HostOptions &h) {
    rkv_options opts = rkv_options_default();
    opts.page_size = o.page_size;
    opts.eviction_policy = static_cast<std::uint32_t>(o.policy);
    opts.pool_slots = o.pool_slots;
    rkv_policy_options policy = rkv_policy_options_default();
    policy.slru_threshold = o.slru_threshold;
    policy.swa_window = o.swa_window;
    rkv_tier_options t = rkv_tier_options_default();
    t.host_slots = h.host_slots;
    t.write_policy = static_cast<std::uint32_t>(h.write_policy);
    t.write_threshold = h.write_threshold;
    t.load_back_min = h.load_back_min;
    t.host_policy = h.host_policy;
    t.copier = static_cast<std::uint32_t>(h.copier);
    t.num_layers = h.num_layers;
    t.num_kv_heads = h.num_kv_heads;
    t.head_dim = h.head_dim;
    t.elem_bytes = h.elem_bytes;
    t.callbacks = h.callbacks;
    rkv_cache *raw = nullptr;
    detail::check(rkv_cache_new_host(&opts, &policy, &t, &raw), "rkv_cache_new_host");
    owner_.reset(raw, rkv_cache_free);
    cache_ = raw;
  }
  Cache(const Cache &) = delete;
  Cache &operator=(const Cache &) = delete;
  Cache(Cache &&o) noexcept
      : owner_(std::move(o.owner_)), cache_(std::exchange(o.cache_, nullptr)) {}
  Cache &operator=(Cache &&o) noexcept {
    if (this != &o) {
      owner_ = std::move(o.owner_);
      cache_ = std::exchange(o.cache_, nullptr);
    }
    return *this;
  }
  /// Frees the cache, which ends every pin of its Locks: a Lock still around afterwards
  /// holds nothing and releases nothing (see Lock).
  ~Cache() = default;

  /// The C handle (for calling the C API directly); still owned by this object, and freed
  /// when it is destroyed (a raw handle from Lock::detach is void then too).
  const rkv_cache *get() const noexcept { return cache_; }

  /// The eviction policy it was built with.
  Policy policy() const {
    std::uint32_t p = 0, threshold = 0;
    detail::check(rkv_cache_eviction_policy(cache_, &p, &threshold), "rkv_cache_eviction_policy");
    return static_cast<Policy>(p);
  }
  /// Its SLRU threshold (Options::slru_threshold; kept whatever the policy).
  std::uint32_t slru_threshold() const {
    std::uint32_t p = 0, threshold = 0;
    detail::check(rkv_cache_eviction_policy(cache_, &p, &threshold), "rkv_cache_eviction_policy");
    return threshold;
  }

  /// Slots of the longest cached prefix of `tokens` in namespace `ns` (pins nothing).
  std::vector<std::uint32_t> match(std::uint64_t ns, Span tokens) const {
    std::vector<std::uint32_t> out(tokens.size);
    std::size_t len = 0;
    detail::check(rkv_match(cache_, ns, tokens.data, tokens.size, out.data(), out.size(), &len),
                  "rkv_match");
    out.resize(len);
    return out;
  }
  /// `match` returning the slots as runs of consecutive slots (run `r` is slots `r.start ..
  /// r.start + r.len - 1`), in token order, neighbours that continue one another joined;
  /// their lengths add up to the match length. Cheaper than `match` when slots come in runs.
  std::vector<rkv_slot_run> match_runs(std::uint64_t ns, Span tokens) const {
    std::vector<rkv_slot_run> out(tokens.size);
    std::size_t n_runs = 0, len = 0;
    detail::check(rkv_match_runs(cache_, ns, tokens.data, tokens.size, out.data(), out.size(),
                                 &n_runs, &len),
                  "rkv_match_runs");
    out.resize(n_runs);
    return out;
  }
  /// Length of the longest cached prefix only.
  std::size_t match_len(std::uint64_t ns, Span tokens) const {
    std::size_t len = 0;
    detail::check(rkv_match(cache_, ns, tokens.data, tokens.size, nullptr, 0, &len), "rkv_match");
    return len;
  }

  /// Match and pin atomically; the Lock carries the matched slots.
  Lock match_lock(std::uint64_t ns, Span tokens) const {
    std::vector<std::uint32_t> out(tokens.size);
    std::size_t len = 0;
    rkv_lock h = 0;
    detail::check(
        rkv_match_lock(cache_, ns, tokens.data, tokens.size, out.data(), out.size(), &len, &h),
        "rkv_match_lock");
    out.resize(len);
    return Lock(owner_, h, len, std::move(out));
  }
  /// `match_lock` whose Lock carries the matched slots as runs (`runs()`; `slots()` stays
  /// empty), as `match_runs` returns them.
  Lock match_lock_runs(std::uint64_t ns, Span tokens) const {
    std::vector<rkv_slot_run> out(tokens.size);
    std::size_t n_runs = 0, len = 0;
    rkv_lock h = 0;
    detail::check(rkv_match_lock_runs(cache_, ns, tokens.data, tokens.size, out.data(),
                                      out.size(), &n_runs, &len, &h),
                  "rkv_match_lock_runs");
    out.resize(n_runs);
    return Lock(owner_, h, len, {}, std::move(out));
  }

  /// Insert; returns how many leading tokens were cached already. `slots` must have one
  /// slot per token (else rkv::Error(RKV_INVALID_ARGUMENT)).
  std::size_t insert(std::uint64_t ns, Span tokens, Span slots) const {
    same_size(tokens, slots, "rkv_insert");
    std::size_t existing = 0;
    detail::check(rkv_insert(cache_, ns, tokens.data, slots.data, tokens.size, &existing),
                  "rkv_insert");
    return existing;
  }
  /// `insert` with a priority and inserted_len (rkv_insert_ex).
  std::size_t insert(std::uint64_t ns, Span tokens, Span slots, const InsertOptions &o) const {
    same_size(tokens, slots, "rkv_insert_ex");
    const rkv_insert_options opts = c_options(o);
    std::size_t existing = 0;
    detail::check(
        rkv_insert_ex(cache_, ns, tokens.data, slots.data, tokens.size, &opts, &existing),
        "rkv_insert_ex");
    return existing;
  }

  /// Insert with the slots given as runs of consecutive slots (run `r` is slots `r.start ..
  /// r.start + r.len - 1`, in token order; their lengths must add up to the token count),
  /// as `alloc_runs` hands them out: the pool step and the new leaf take O(runs) instead of
  /// O(tokens). Returns how many leading tokens were cached already, as `insert`.
  std::size_t insert_runs(std::uint64_t ns, Span tokens,
                          const std::vector<rkv_slot_run> &runs) const {
    std::size_t existing = 0;
    detail::check(rkv_insert_runs(cache_, ns, tokens.data, tokens.size, runs.data(),
                                  runs.size(), &existing),
                  "rkv_insert_runs");
    return existing;
  }
  /// `insert_runs` with a priority and inserted_len (rkv_insert_runs_ex).
  std::size_t insert_runs(std::uint64_t ns, Span tokens, const std::vector<rkv_slot_run> &runs,
                          const InsertOptions &o) const {
    const rkv_insert_options opts = c_options(o);
    std::size_t existing = 0;
    detail::check(rkv_insert_runs_ex(cache_, ns, tokens.data, tokens.size, runs.data(),
                                     runs.size(), &opts, &existing),
                  "rkv_insert_runs_ex");
    return existing;
  }

  /// `insert_runs` and pin atomically, as `insert_lock`.
  InsertLock insert_lock_runs(std::uint64_t ns, Span tokens,
                              const std::vector<rkv_slot_run> &runs) const {
    std::size_t existing = 0;
    rkv_lock h = 0;
    detail::check(rkv_insert_lock_runs(cache_, ns, tokens.data, tokens.size, runs.data(),
                                       runs.size(), &existing, &h),
                  "rkv_insert_lock_runs");
    std::size_t len = 0;
    if (rkv_lock_len(cache_, h, &len) != RKV_OK) len = 0;
    return InsertLock{existing, Lock(owner_, h, len, {})};
  }
  /// `insert_lock_runs` with a priority and inserted_len (rkv_insert_lock_runs_ex).
  InsertLock insert_lock_runs(std::uint64_t ns, Span tokens,
                              const std::vector<rkv_slot_run> &runs,
                              const InsertOptions &o) const {
    const rkv_insert_options opts = c_options(o);
    std::size_t existing = 0;
    rkv_lock h = 0;
    detail::check(rkv_insert_lock_runs_ex(cache_, ns, tokens.data, tokens.size, runs.data(),
                                          runs.size(), &opts, &existing, &h),
                  "rkv_insert_lock_runs_ex");
    std::size_t len = 0;
    if (rkv_lock_len(cache_, h, &len) != RKV_OK) len = 0;
    return InsertLock{existing, Lock(owner_, h, len, {})};
  }

  /// Insert and pin atomically.
  InsertLock insert_lock(std::uint64_t ns, Span tokens, Span slots) const {
    same_size(tokens, slots, "rkv_insert_lock");
    std::size_t existing = 0;
    rkv_lock h = 0;
    detail::check(
        rkv_insert_lock(cache_, ns, tokens.data, slots.data, tokens.size, &existing, &h),
        "rkv_insert_lock");
    std::size_t len = 0;
    if (rkv_lock_len(cache_, h, &len) != RKV_OK) len = 0;
    return InsertLock{existing, Lock(owner_, h, len, {})};
  }
  /// `insert_lock` with a priority and inserted_len (rkv_insert_lock_ex).
  InsertLock insert_lock(std::uint64_t ns, Span tokens, Span slots,
                         const InsertOptions &o) const {
    same_size(tokens, slots, "rkv_insert_lock_ex");
    const rkv_insert_options opts = c_options(o);
    std::size_t existing = 0;
    rkv_lock h = 0;
    detail::check(rkv_insert_lock_ex(cache_, ns, tokens.data, slots.data, tokens.size, &opts,
                                     &existing, &h),
                  "rkv_insert_lock_ex");
    std::size_t len = 0;
    if (rkv_lock_len(cache_, h, &len) != RKV_OK) len = 0;
    return InsertLock{existing, Lock(owner_, h, len, {})};
  }

  /// Evict at least `n` tokens in pool mode (the slots go back to the pool); returns the
  /// count freed.
  std::size_t evict(std::size_t n) const {
    std::size_t evicted = 0;
    detail::check(rkv_evict(cache_, n, nullptr, nullptr, &evicted), "rkv_evict");
    return evicted;
  }

  /// Evict at least `n` tokens; `on_free(const uint32_t *slots, size_t n)` is called with
  /// every freed slot exactly once (in caller-managed mode the slots are then the
  /// caller's; in pool mode they are back in the pool already). An exception thrown by
  /// `on_free` does not stop the eviction or the later calls of `on_free` (each of them is
  /// still handed its slots, which would otherwise be lost in caller-managed mode); the
  /// first exception is rethrown once the eviction is complete.
  template <class F>
  std::size_t evict(std::size_t n, F &&on_free) const {
    return evict_via<std::uint32_t>(n, on_free, rkv_evict, "rkv_evict");
  }

  /// Evict at least `n` tokens, handing the freed slots over as runs of consecutive slots:
  /// `on_free(const rkv_slot_run *runs, size_t n_runs)` (run `r` is slots `r.start ..
  /// r.start + r.len - 1`), once per evicted leaf, every freed slot in exactly one run.
  /// O(runs) per leaf where `evict` lists every slot. Otherwise as `evict` (the first
  /// exception from `on_free` is rethrown after the eviction and every call of it).
  template <class F>
  std::size_t evict_runs(std::size_t n, F &&on_free) const {
    return evict_via<rkv_slot_run>(n, on_free, rkv_evict_runs, "rkv_evict_runs");
  }

  /// With a sliding window (Options::swa_window): free at least `n` tokens' KV of the kind
  /// `target` names (rkv_evict_kv), calling `on_free(bool full, bool swa, const uint32_t
  /// *slots, size_t k)` once per evicted node with what was freed of it: both (a leaf
  /// whole), swa only (an SWA tombstone: its full KV stays cached), full only (a
  /// tombstone's full KV). In pool mode the full KV goes back to the pool (do not free it
  /// again); the SWA KV is the caller's to free. Returns the tokens freed of that kind. The
  /// first exception from `on_free` is rethrown after the eviction and every call of it.
  template <class F>
  std::size_t evict_kv(EvictTarget target, std::size_t n, F &&on_free) const {
    struct Ctx {
      std::remove_reference_t<F> *f;
      std::exception_ptr error;
    } ctx{&on_free, nullptr};
    void (*tramp)(void *, std::uint32_t, const std::uint32_t *, std::size_t) =
        [](void *p, std::uint32_t freed, const std::uint32_t *xs, std::size_t k) {
          Ctx *c = static_cast<Ctx *>(p);
          try {
            (*c->f)((freed & RKV_FREED_FULL) != 0, (freed & RKV_FREED_SWA) != 0, xs, k);
          } catch (...) {
            if (!c->error) c->error = std::current_exception();
          }
        };
    std::size_t evicted = 0;
    rkv_status st =
        rkv_evict_kv(cache_, static_cast<std::uint32_t>(target), n, tramp, &ctx, &evicted);
    if (ctx.error) std::rethrow_exception(ctx.error);
    detail::check(st, "rkv_evict_kv");
    return evicted;
  }

  /// Evict at least `n` tokens and return the freed slots.
  std::vector<std::uint32_t> evict_slots(std::size_t n) const {
    std::vector<std::uint32_t> freed;
    evict(n, [&freed](const std::uint32_t *s, std::size_t k) { freed.insert(freed.end(), s, s + k); });
    return freed;
  }

  /// Pool mode: `n` slots, all or nothing (evicts when short). `Error(RKV_OUT_OF_SLOTS)`
  /// for more than the pool has, before sizing the output.
  std::vector<std::uint32_t> alloc(std::size_t n) const {
    if (n > (std::size_t{1} << 16)) {  // cheap for small requests; stops absurd ones
      const Stats s = stats();
      if (s.pool_slots == 0) {
        throw Error(RKV_NO_POOL, std::string("rkv_alloc: this cache has no slot pool (it was "
                                             "created with pool_slots = 0: the caller "
                                             "manages slots)"));
      }
      if (n > s.pool_slots) {
        throw Error(RKV_OUT_OF_SLOTS, "rkv_alloc: n_slots = " + std::to_string(n) +
                                          " is more than the whole pool of " +
                                          std::to_string(s.pool_slots) + " slots");
      }
    }
    std::vector<std::uint32_t> out(n);
    detail::check(rkv_alloc(cache_, n, out.data()), "rkv_alloc");
    return out;
  }

  /// Pool mode: return allocated, never adopted slots.
  void free(Span slots) const { detail::check(rkv_free(cache_, slots.data, slots.size), "rkv_free"); }

  /// Pool mode: `n` slots as runs of consecutive slots, all or nothing (evicts when short);
  /// O(runs) instead of O(slots). Pass them to `insert_runs` or `free_runs`.
  std::vector<rkv_slot_run> alloc_runs(std::size_t n) const {
    std::vector<rkv_slot_run> out(8);
    for (;;) {
      std::size_t n_runs = 0;
      rkv_status s = rkv_alloc_runs(cache_, n, out.data(), out.size(), &n_runs);
      if (s == RKV_BUFFER_TOO_SMALL) {  // the slots went back; retry with room for them
        out.resize(std::max(n_runs, 2 * out.size()));
        continue;
      }
      detail::check(s, "rkv_alloc_runs");
      out.resize(n_runs);
      return out;
    }
  }

  /// Pool mode: return allocated, never adopted slots given as runs.
  void free_runs(const std::vector<rkv_slot_run> &runs) const {
    detail::check(rkv_free_runs(cache_, runs.data(), runs.size()), "rkv_free_runs");
  }

  /// Tokens pinned by a raw handle.
  std::size_t lock_len(rkv_lock h) const {
    std::size_t len = 0;
    detail::check(rkv_lock_len(cache_, h, &len), "rkv_lock_len");
    return len;
  }

  /// Release a raw handle (see Lock::detach).
  void release(rkv_lock h) const { detail::check(rkv_release(cache_, h), "rkv_release"); }

  /// Admits a request (rkv_request_admit): pins the longest cached prefix of `tokens` in
  /// namespace `ns` and allocates slots for the rest; its inserts carry eviction priority
  /// `priority` (32 bits). Needs a pool (Error(RKV_NO_POOL)); Error(RKV_OUT_OF_SLOTS) when
  /// the pool cannot hold the rest (nothing held then).
  Request admit(std::uint64_t ns, Span tokens, std::int64_t priority = 0) const {
    rkv_request *r = nullptr;
    detail::check(rkv_request_admit(cache_, ns, tokens.data, tokens.size, priority, &r),
                  "rkv_request_admit");
    return Request(owner_, r);
  }

  Stats stats() const {
    Stats s{};
    detail::check(rkv_cache_stats(cache_, &s), "rkv_cache_stats");
    return s;
  }

  /// Drop every unpinned page of namespace `ns` in pool mode (the slots go back to the
  /// pool); returns the tokens freed. Pinned pages stay until their locks are released;
  /// other namespaces are untouched; an unknown namespace frees 0 (not an error). Without
  /// a pool a callback is required: `Error(RKV_NULL_ARGUMENT)`, as for `evict(n)`.
  std::size_t drop_namespace(std::uint64_t ns) const {
    std::size_t freed = 0;
    detail::check(rkv_drop_namespace(cache_, ns, nullptr, nullptr, &freed),
                  "rkv_drop_namespace");
    return freed;
  }

  /// Drop every unpinned page of namespace `ns`; `on_free(const uint32_t *slots, size_t n)`
  /// is called with every freed slot exactly once, as in `evict(n, on_free)` (the first
  /// exception from `on_free` is rethrown after the drop and every call of it).
  template <class F>
  std::size_t drop_namespace(std::uint64_t ns, F &&on_free) const {
    return evict_via<std::uint32_t>(ns, on_free, rkv_drop_namespace, "rkv_drop_namespace");
  }

  /// Counts of namespace `ns`; all zeros for an unknown namespace.
  NamespaceStats namespace_stats(std::uint64_t ns) const {
    NamespaceStats s{};
    detail::check(rkv_cache_namespace_stats(cache_, ns, &s), "rkv_cache_namespace_stats");
    return s;
  }

  /// Live namespaces: those with at least one cached page (an empty one is reclaimed).
  std::uint64_t namespace_count() const {
    std::uint64_t n = 0;
    detail::check(rkv_namespace_count(cache_, &n), "rkv_namespace_count");
    return n;
  }

  /// Drop every unpinned page.
  void reset() const { detail::check(rkv_cache_reset(cache_), "rkv_cache_reset"); }

  /// Empty the cache holding it exclusively (rkv_cache_clear): drops every unpinned page, as
  /// reset() does, and with events on publishes one ALL_BLOCKS_CLEARED when that leaves the
  /// cache empty (nothing pinned), or the removals of the dropped pages otherwise. Not const:
  /// it must not race with any other call on this cache (reset() may). In caller-managed
  /// mode the dropped slots are not reported; clear(on_free) reports them.
  void clear() {
    detail::check(rkv_cache_clear(owner_.get(), nullptr, nullptr), "rkv_cache_clear");
  }

  /// clear(), calling `on_free(const uint32_t *slots, size_t n)` with every dropped slot
  /// exactly once (in pool mode they go back to the pool anyway: do not free them again).
  /// The first exception from `on_free` is rethrown after the clear and every call of it.
  template <class F>
  void clear(F &&on_free) {
    struct Ctx {
      F *f;
      std::exception_ptr error;
    } ctx{&on_free, nullptr};
    void (*tramp)(void *, const std::uint32_t *, std::size_t) =
        [](void *p, const std::uint32_t *xs, std::size_t k) {
          Ctx *c = static_cast<Ctx *>(p);
          try {
            (*c->f)(xs, k);
          } catch (...) {
            if (!c->error) c->error = std::current_exception();
          }
        };
    rkv_status st = rkv_cache_clear(owner_.get(), tramp, &ctx);
    if (ctx.error) std::rethrow_exception(ctx.error);
    detail::check(st, "rkv_cache_clear");
  }

  /// Free memory the index unlinked earlier, off the latency-critical calls (see
  /// rkv_reclaim): call it once per scheduler step, where latency does not matter.
  void reclaim() const { detail::check(rkv_reclaim(cache_), "rkv_reclaim"); }

  // -- KV events (rkv_events_*) --

  /// Turns KV events on (rkv_events_enable): once, on an empty cache (right after
  /// construction), else Error(RKV_INVALID_ARGUMENT). Not const: it must not race with any
  /// other call on this cache.
  void enable_events(const EventOptions &o = EventOptions{}) {
    rkv_events_options opts = rkv_events_options_default();
    opts.hash_mode = static_cast<std::uint32_t>(o.hash_mode);
    opts.medium = static_cast<std::uint32_t>(o.medium);
    opts.max_drain_batches = o.max_drain_batches;
    detail::check(rkv_events_enable(owner_.get(), &opts), "rkv_events_enable");
  }

  /// Names namespace `ns` on the wire before its first insert (rkv_events_set_namespace);
  /// std::nullopt for none.
  void set_namespace_meta(std::uint64_t ns, const std::optional<std::string> &lora_name,
                          const std::optional<std::string> &cache_salt = std::nullopt) const {
    detail::check(rkv_events_set_namespace(cache_, ns, lora_name ? lora_name->c_str() : nullptr,
                                           cache_salt ? cache_salt->c_str() : nullptr),
                  "rkv_events_set_namespace");
  }

  /// Closes the events recorded so far into a batch; its sequence number, or std::nullopt
  /// when there were none (rkv_events_flush).
  std::optional<std::uint64_t> flush_events() const {
    std::uint64_t seq = RKV_EVENTS_NO_SEQ;
    detail::check(rkv_events_flush(cache_, &seq), "rkv_events_flush");
    if (seq == RKV_EVENTS_NO_SEQ) return std::nullopt;
    return seq;
  }

  /// Takes every closed batch (rkv_events_drain) and returns its events in sequence order
  /// (empty while a Publisher is attached). Sizes its buffers from the library's answer:
  /// one measuring call, then one that takes everything (more if batches close meanwhile).
  std::vector<Event> drain_events() const {
    std::vector<Event> out;
    std::vector<rkv_event> ev;
    std::vector<std::uint64_t> h;
    std::vector<std::uint32_t> t;
    std::vector<char> s;
    for (;;) {
      rkv_events_drain_info info{};
      rkv_status st = rkv_events_drain(cache_, ev.data(), ev.size(), h.data(), h.size(),
                                       t.data(), t.size(), s.data(), s.size(), &info);
      if (st == RKV_BUFFER_TOO_SMALL) {
        ev.resize(std::max(ev.size(), info.n_events));
        h.resize(std::max(h.size(), info.n_hashes));
        t.resize(std::max(t.size(), info.n_tokens));
        s.resize(std::max(s.size(), info.n_string_bytes));
        continue;
      }
      detail::check(st, "rkv_events_drain");
      for (std::size_t i = 0; i < info.n_events; ++i) out.push_back(to_event(ev[i]));
      if (info.batches_left == 0 || info.n_batches == 0) return out;
    }
  }

  /// The event counters (rkv_events_counters).
  EventStats events_stats() const {
    EventStats s{};
    detail::check(rkv_events_counters(cache_, &s), "rkv_events_counters");
    return s;
  }

  /// Starts a ZMQ publisher of this cache's events (rkv_events_publish_ex, with the options'
  /// KV group): a bad endpoint or group is Error(RKV_INVALID_ARGUMENT), an address in use
  /// Error(RKV_IO_ERROR), and then nothing changed. The Publisher stops itself when
  /// destroyed, and may outlive this Cache.
  Publisher publish(const PublisherOptions &o = PublisherOptions{}) const {
    rkv_publisher_options opts = rkv_publisher_options_default();
    opts.endpoint = o.endpoint.c_str();
    opts.replay_endpoint = o.replay_endpoint ? o.replay_endpoint->c_str() : nullptr;
    opts.topic = o.topic.c_str();
    opts.encoding = static_cast<std::uint32_t>(o.encoding);
    opts.buffer_steps = o.buffer_steps;
    opts.max_queue = o.max_queue;
    opts.auto_flush_ms = o.auto_flush.count() > 0 ? static_cast<std::uint64_t>(o.auto_flush.count()) : 0;
    opts.linger_ms = o.linger.count() > 0 ? static_cast<std::uint64_t>(o.linger.count()) : 0;
    opts.data_parallel_rank = o.data_parallel_rank;
    // 0 is "no window" in the C struct: a window of 0 given here is refused as such.
    if (o.sliding_window && *o.sliding_window == 0) {
      throw Error(RKV_INVALID_ARGUMENT,
                  std::string("Cache::publish: sliding_window = 0: a window is >= 1 token"));
    }
    rkv_kv_group group = rkv_kv_group_default();
    group.group_idx = o.group_idx;
    group.spec_kind = static_cast<std::uint32_t>(o.kv_cache_spec_kind);
    group.sliding_window = o.sliding_window.value_or(0);
    rkv_publisher *p = nullptr;
    detail::check(rkv_events_publish_ex(cache_, &opts, &group, &p), "rkv_events_publish_ex");
    return Publisher(p);
  }

  // -- the host tier (a Cache made with HostOptions) --

  /// The device prefix of `tokens` (pins nothing) and how far host copies extend it
  /// (rkv_match_ex; host_len is 0 without a tier).
  Lookup lookup(std::uint64_t ns, Span tokens) const { return lookup_impl(ns, tokens, false); }
  /// lookup() pinning the device prefix (Lookup::lock, also for a match of 0 tokens).
  Lookup lookup_lock(std::uint64_t ns, Span tokens) const {
    return lookup_impl(ns, tokens, true);
  }
  /// Starts loading back the host pages extending the device match (at most max_tokens);
  /// take the result once with load_wait or load_poll. Error(RKV_OUT_OF_SLOTS) when the
  /// device cannot hold them (nothing changed); Error(RKV_INVALID_ARGUMENT) without a tier.
  std::uint64_t load_back(std::uint64_t ns, Span tokens,
                          std::size_t max_tokens = SIZE_MAX) const {
    std::uint64_t t = 0;
    detail::check(rkv_cache_load_back(cache_, ns, tokens.data, tokens.size, max_tokens, &t),
                  "rkv_cache_load_back");
    return t;
  }
  /// Waits for a load-back and takes its result (Error(RKV_DEVICE_ERROR) for a failed copy,
  /// rolled back; Error(RKV_INVALID_ARGUMENT) for an unknown or taken ticket).
  Loaded load_wait(std::uint64_t ticket) const {
    Loaded r;
    take_load(ticket, nullptr, r);
    return r;
  }
  /// Takes a load-back's result if it is done (true), else false (`out` untouched).
  bool load_poll(std::uint64_t ticket, Loaded &out) const {
    int done = 0;
    take_load(ticket, &done, out);
    return done != 0;
  }
  /// Evicts at least `n` host tokens (host-only leaves); returns the host tokens freed.
  /// Error(RKV_INVALID_ARGUMENT) without a tier.
  std::size_t evict_host(std::size_t n) const {
    std::size_t k = 0;
    detail::check(rkv_cache_evict_host(cache_, n, &k), "rkv_cache_evict_host");
    return k;
  }
  /// The host tier's counts and counters (Error(RKV_INVALID_ARGUMENT) without a tier).
  TierStats tier_stats() const {
    TierStats s{};
    detail::check(rkv_cache_tier_stats(cache_, &s), "rkv_cache_tier_stats");
    return s;
  }
  /// Waits for every host tier copy in flight (nothing to do without a tier).
  void wait_all() const { detail::check(rkv_cache_wait_all(cache_), "rkv_cache_wait_all"); }

 private:
  Lookup lookup_impl(std::uint64_t ns, Span tokens, bool pin) const {
    Lookup m;
    m.slots.resize(tokens.size);
    rkv_match_options o = rkv_match_options_default();
    o.flags = pin ? RKV_MATCH_LOCK : 0u;
    rkv_match_result r{};
    // out_slots is never NULL here (a 0-token query passes an empty vector's data with
    // out_cap 0, which needs nothing written): the buffer always holds the match.
    std::uint32_t dummy = 0;
    std::uint32_t *out = m.slots.empty() ? &dummy : m.slots.data();
    detail::check(
        rkv_match_ex(cache_, ns, tokens.data, tokens.size, &o, out, m.slots.size(), &r),
        "rkv_match_ex");
    m.slots.resize(r.device_len);
    m.host_len = r.host_len;
    if (pin) m.lock = Lock(owner_, r.lock, r.device_len, m.slots);
    return m;
  }
  // Takes a load-back result, growing the buffer when it did not fit (kept meanwhile).
  void take_load(std::uint64_t ticket, int *done, Loaded &out) const {
    std::vector<std::uint32_t> slots(64);
    for (;;) {
      std::size_t len = 0;
      rkv_load_result r{};
      rkv_status st =
          done ? rkv_cache_load_poll(cache_, ticket, slots.data(), slots.size(), &len, &r, done)
               : rkv_cache_load_wait(cache_, ticket, slots.data(), slots.size(), &len, &r);
      if (st == RKV_BUFFER_TOO_SMALL) {
        slots.resize(len);
        continue;
      }
      detail::check(st, done ? "rkv_cache_load_poll" : "rkv_cache_load_wait");
      if (done && *done == 0) return;
      slots.resize(len);
      out.lock = Lock(owner_, r.lock, r.len, slots);
      out.slots = std::move(slots);
      out.device_len = r.device_len;
      out.loaded = r.loaded;
      out.outcome = static_cast<rkv_load_outcome>(r.outcome);
      return;
    }
  }

  // `evict`, `evict_runs` and `drop_namespace`: calls `c_evict` (with `n`, a token count or
  // a namespace) with a trampoline that passes each array of `T` (slots or runs) to
  // `on_free`; an exception from `on_free` is kept (the first one), the later arrays are
  // still passed on, and it is rethrown once the eviction completes.
  template <class T, class F, class CEvict, class N>
  std::size_t evict_via(N n, F &on_free, CEvict c_evict, const char *what) const {
    struct Ctx {
      F *f;
      std::exception_ptr error;
    } ctx{&on_free, nullptr};
    void (*tramp)(void *, const T *, std::size_t) = [](void *p, const T *xs, std::size_t k) {
      Ctx *c = static_cast<Ctx *>(p);
      try {
        (*c->f)(xs, k);
      } catch (...) {
        if (!c->error) c->error = std::current_exception();
      }
    };
    std::size_t evicted = 0;
    rkv_status st = c_evict(cache_, n, tramp, &ctx, &evicted);
    if (ctx.error) std::rethrow_exception(ctx.error);
    detail::check(st, what);
    return evicted;
  }

  static Event to_event(const rkv_event &e) {
    Event out;
    out.seq = e.seq;
    out.ts = e.ts;
    out.kind = static_cast<EventKind>(e.kind);
    out.medium = static_cast<Medium>(e.medium);
    if (e.n_block_hashes) out.block_hashes.assign(e.block_hashes, e.block_hashes + e.n_block_hashes);
    if (e.has_parent) out.parent_block_hash = e.parent_block_hash;
    if (e.n_token_ids) out.token_ids.assign(e.token_ids, e.token_ids + e.n_token_ids);
    out.block_size = e.block_size;
    if (e.lora_name) out.lora_name = std::string(e.lora_name);
    if (e.cache_salt) out.cache_salt = std::string(e.cache_salt);
    return out;
  }

  static rkv_insert_options c_options(const InsertOptions &o) noexcept {
    rkv_insert_options opts = rkv_insert_options_default();
    opts.priority = o.priority;
    opts.inserted_len = o.inserted_len;
    return opts;
  }

  static void same_size(Span a, Span b, const char *function) {
    if (a.size != b.size) {
      throw Error(RKV_INVALID_ARGUMENT, std::string(function) + ": " +
                                            std::to_string(a.size) + " tokens but " +
                                            std::to_string(b.size) +
                                            " slots (one slot per token)");
    }
  }

  // The owner of the C cache, shared only with the Locks' weak_ptrs (so that a Lock can
  // tell whether its cache still lives); `cache_` is the same pointer, for the calls.
  std::shared_ptr<rkv_cache> owner_;
  const rkv_cache *cache_ = nullptr;
};

}  // namespace rkv

#endif  // RADIXKV_CACHE_HPP
