// radixkv C++17 bindings: header-only, over the C ABI of include/radixkv.h.
//
//   rkv::Cache cache(rkv::Options{/*page_size=*/1, rkv::Policy::lru, /*pool_slots=*/4096});
//   rkv::Lock lock = cache.match_lock(ns, tokens);         // pins lock.slots()
//   std::vector<uint32_t> fresh = cache.alloc(tokens.size() - lock.length());
//   ...
//   cache.insert(ns, tokens, slots);                        // or insert_lock
//   lock.release();                                         // or let it go out of scope
//
// Ownership: rkv::Cache owns an rkv_cache (freed by its destructor) and rkv::Lock owns one
// rkv_lock (released by its destructor); both are move-only. A Lock may outlive its Cache
// (a class declaring its members in the "wrong" order): destroying the Cache frees the
// cache and ends every pin at once, and a Lock left over then releases nothing (its
// destructor does nothing; release() throws RKV_INVALID_LOCK). The Cache shares its handle
// with its Locks through a std::shared_ptr control block, so a Lock never calls into a
// freed cache. Errors are thrown as rkv::Error: status() is the rkv_status and what() the
// library's message saying exactly what was wrong (rkv_last_error_message).
//
// Thread-safety: every const member function of rkv::Cache may run from many threads at
// once (they map to the C functions that take `const rkv_cache *`); constructing,
// assigning and destroying a Cache must not race with other calls on it. A Lock is a plain
// object: one thread at a time uses it, but it may be moved to and released from any
// thread, also while another thread destroys its Cache.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef RADIXKV_HPP
#define RADIXKV_HPP

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "radixkv.h"

namespace rkv {

/// A failed call: status() is the rkv_status; what() says exactly what was wrong, as the
/// library put it (rkv_last_error_message), e.g. "rkv_insert: slots[3] = 70000 is out of
/// range: the pool has 65536 slots (ids 0 to 65535)"; the wording is for people and may
/// change, so branch on status().
class Error : public std::runtime_error {
 public:
  /// An error whose what() is `function: <the status's description>`.
  Error(rkv_status status, const char *function)
      : Error(status, std::string(function) + ": " + rkv_status_str(status)) {}
  /// An error whose what() is `message`.
  Error(rkv_status status, const std::string &message)
      : std::runtime_error(message), status_(status) {}
  /// The error of the C call `function` that just returned `status` on this thread: what()
  /// is the library's message for it (or, if it left none, the status's description).
  static Error last(rkv_status status, const char *function) {
    const char *m = rkv_last_error_message();
    if (m != nullptr && m[0] != '\0') return Error(status, std::string(m));
    return Error(status, function);
  }
  /// The C status code of the failure.
  rkv_status status() const noexcept { return status_; }

 private:
  rkv_status status_;
};

namespace detail {
inline void check(rkv_status status, const char *function) {
  if (status != RKV_OK) throw Error::last(status, function);
}
}  // namespace detail

/// The crate version ("0.1.0").
inline std::string version() { return rkv_version(); }
/// The C ABI version (1).
inline std::uint32_t abi_version() noexcept { return rkv_abi_version(); }

/// Eviction order.
enum class Policy : std::uint32_t { lru = RKV_EVICT_LRU, fifo = RKV_EVICT_FIFO };

/// Options of a new cache (see rkv_options).
struct Options {
  std::uint32_t page_size = 1;
  Policy policy = Policy::lru;
  std::uint64_t pool_slots = 0;  ///< 0: caller-managed slots; N: built-in pool of N slots.
};

/// Counts and counters (rkv_stats).
using Stats = rkv_stats;

/// Counts of one namespace (rkv_namespace_stats): cached_tokens, evictable_tokens,
/// protected_tokens, nodes.
using NamespaceStats = rkv_namespace_stats;

/// A read-only view of tokens or slots: from a pointer and length or a std::vector.
struct Span {
  const std::uint32_t *data = nullptr;
  std::size_t size = 0;
  Span() noexcept = default;
  Span(const std::uint32_t *d, std::size_t n) noexcept : data(d), size(n) {}
  Span(const std::vector<std::uint32_t> &v) noexcept : data(v.data()), size(v.size()) {}  // NOLINT
};

class Cache;

/// A pin on a matched (or inserted) prefix, released by the destructor or by release().
/// Move-only. An empty Lock (default-constructed, moved-from, released or detached) holds
/// nothing; neither does a Lock whose Cache was destroyed (that ended its pin): it may
/// outlive the Cache safely, and its destructor then does nothing.
class Lock {
 public:
  Lock() noexcept = default;
  Lock(const Lock &) = delete;
  Lock &operator=(const Lock &) = delete;
  Lock(Lock &&o) noexcept
      : cache_(std::move(o.cache_)),
        handle_(std::exchange(o.handle_, 0)),
        length_(std::exchange(o.length_, 0)),
        slots_(std::move(o.slots_)),
        runs_(std::move(o.runs_)) {}
  Lock &operator=(Lock &&o) noexcept {
    if (this != &o) {
      drop();
      cache_ = std::move(o.cache_);
      handle_ = std::exchange(o.handle_, 0);
      length_ = std::exchange(o.length_, 0);
      slots_ = std::move(o.slots_);
      runs_ = std::move(o.runs_);
    }
    return *this;
  }
  /// Releases the pin (errors are ignored: a destructor cannot throw).
  ~Lock() { drop(); }

  /// Whether this Lock holds a pin (false once its Cache is destroyed).
  explicit operator bool() const noexcept { return handle_ != 0 && !cache_.expired(); }
  /// The raw handle (0 when empty).
  rkv_lock handle() const noexcept { return handle_; }
  /// Tokens pinned.
  std::size_t length() const noexcept { return length_; }
  /// The slots of the matched prefix (match_lock only; empty for insert_lock and
  /// match_lock_runs).
  const std::vector<std::uint32_t> &slots() const noexcept { return slots_; }
  /// The slots of the matched prefix as runs of consecutive slots (match_lock_runs only).
  const std::vector<rkv_slot_run> &runs() const noexcept { return runs_; }

  /// Releases the pin now. Throws rkv::Error(RKV_INVALID_LOCK) on an empty Lock (for
  /// instance a second release), on a Lock whose Cache was destroyed, or on a handle the
  /// cache refuses. The Lock is empty afterwards either way.
  void release() {
    if (handle_ == 0) {
      throw Error(RKV_INVALID_LOCK, std::string("rkv_release: this rkv::Lock is empty "
                                                "(released, detached or moved from)"));
    }
    std::shared_ptr<rkv_cache> c = std::exchange(cache_, {}).lock();
    rkv_lock h = std::exchange(handle_, 0);
    length_ = 0;
    slots_.clear();
    runs_.clear();
    if (!c) {
      throw Error(RKV_INVALID_LOCK, std::string("rkv_release: the rkv::Cache of this lock was "
                                                "destroyed, which released the lock already"));
    }
    detail::check(rkv_release(c.get(), h), "rkv_release");
  }

  /// Gives up ownership without releasing: the caller must rkv_release the returned
  /// handle itself (while the cache lives). The Lock becomes empty.
  rkv_lock detach() noexcept {
    cache_.reset();
    length_ = 0;
    slots_.clear();
    runs_.clear();
    return std::exchange(handle_, 0);
  }

 private:
  friend class Cache;
  Lock(std::weak_ptr<rkv_cache> c, rkv_lock h, std::size_t len,
       std::vector<std::uint32_t> slots, std::vector<rkv_slot_run> runs = {}) noexcept
      : cache_(std::move(c)),
        handle_(h),
        length_(len),
        slots_(std::move(slots)),
        runs_(std::move(runs)) {}
  // Releases the pin if the cache still lives. The shared_ptr taken here keeps the cache
  // alive for the call: a Cache destroyed meanwhile on another thread is freed only after
  // (by whichever owner lets go last), so rkv_release never meets a freed cache.
  void drop() noexcept {
    if (handle_ != 0) {
      if (std::shared_ptr<rkv_cache> c = cache_.lock()) (void)rkv_release(c.get(), handle_);
    }
    cache_.reset();
    handle_ = 0;
  }

  std::weak_ptr<rkv_cache> cache_;
  rkv_lock handle_ = 0;
  std::size_t length_ = 0;
  std::vector<std::uint32_t> slots_;
  std::vector<rkv_slot_run> runs_;
};

/// Result of insert_lock.
struct InsertLock {
  std::size_t existing;  ///< Leading tokens that were cached already (slots not adopted).
  Lock lock;             ///< Pins the inserted prefix.
};

/// Owns an rkv_cache. Move-only; its const members are safe from many threads at once.
class Cache {
 public:
  explicit Cache(const Options &o = Options{}) {
    rkv_options opts = rkv_options_default();
    opts.page_size = o.page_size;
    opts.eviction_policy = static_cast<std::uint32_t>(o.policy);
    opts.pool_slots = o.pool_slots;
    rkv_cache *raw = nullptr;
    detail::check(rkv_cache_new(&opts, &raw), "rkv_cache_new");
    owner_.reset(raw, rkv_cache_free);  // frees `raw` itself if it throws
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

  /// Free memory the index unlinked earlier, off the latency-critical calls (see
  /// rkv_reclaim): call it once per scheduler step, where latency does not matter.
  void reclaim() const { detail::check(rkv_reclaim(cache_), "rkv_reclaim"); }

 private:
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

#endif  // RADIXKV_HPP
