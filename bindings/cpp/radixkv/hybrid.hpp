// radixkv C++17 bindings, one piece of radixkv.hpp (include that one, not this): the hybrid
// tree (rkv_hybrid: SGLang's UnifiedRadixCache tree with FULL, SWA and Mamba): Component,
// HybridOptions, I64Span, HybridAction, HybridInsertArgs, HybridInsert, HybridLock and
// rkv::HybridTree.
// It includes what it needs, so it also compiles alone.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef RADIXKV_HYBRID_HPP
#define RADIXKV_HYBRID_HPP

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "base.hpp"

namespace rkv {

// ---------------------------------------------------------------------------------------
// The hybrid tree: node-shaped (callers hold node ids), int64 device indices, components
// FULL (always), SWA (a sliding window) and Mamba (one recurrent state per node).

/// A component of a hybrid tree (rkv_hybrid_component).
enum class Component : std::uint32_t {
  full = RKV_HYBRID_FULL,    ///< Full attention's KV: FULL pool indices.
  swa = RKV_HYBRID_SWA,      ///< Sliding-window KV, named by the FULL indices of its tokens.
  mamba = RKV_HYBRID_MAMBA   ///< Mamba states: Mamba pool slots.
};

/// What a HybridTree is made with (rkv_hybrid_options).
struct HybridOptions {
  std::uint64_t page_size = 1;   ///< Tokens per page, >= 1.
  std::uint64_t swa_window = 0;  ///< SGLang's swa_retain_window in tokens; 0: no SWA.
  bool mamba = false;            ///< Whether the tree has a Mamba component.
  std::uint64_t first_id = 1;    ///< The root's node id.
};

/// A hybrid tree's node id (rkv_hybrid_node).
using HybridNode = rkv_hybrid_node;
/// A match (rkv_hybrid_match_result): device_prefix_len, full_hit_len, last_device_node,
/// has_last_visited / last_visited.
using HybridMatch = rkv_hybrid_match_result;
/// Sizes per component (rkv_hybrid_sizes): full_/swa_/mamba_ evictable and protected.
using HybridSizes = rkv_hybrid_sizes;

/// A borrowed array of int64 indices (keys, values, states).
struct I64Span {
  const std::int64_t *data = nullptr;
  std::size_t size = 0;
  I64Span() noexcept = default;
  I64Span(const std::int64_t *d, std::size_t n) noexcept : data(d), size(n) {}
  I64Span(const std::vector<std::int64_t> &v) noexcept : data(v.data()), size(v.size()) {}  // NOLINT
  const std::int64_t *begin() const noexcept { return data; }
  const std::int64_t *end() const noexcept { return data + size; }
  std::vector<std::int64_t> to_vector() const { return std::vector<std::int64_t>(begin(), end()); }
};

/// What an insert's action asks (rkv_hybrid_action_kind).
enum class ActionKind : std::uint32_t {
  free_device_kv = RKV_HYBRID_FREE_DEVICE_KV,  ///< Free `a` in FULL and SWA.
  free_device_kv_full_only = RKV_HYBRID_FREE_DEVICE_KV_FULL_ONLY,  ///< Free `a` in FULL.
  swa_rebuild = RKV_HYBRID_SWA_REBUILD,  ///< Rebuild `node`'s SWA from FULL indices `a`.
  recover_swa_with_locked_full =
      RKV_HYBRID_RECOVER_SWA_WITH_LOCKED_FULL  ///< `node` keeps `a`; recover SWA from `b`.
};

/// One action of an insert, valid only during the callback (copy the arrays to keep them).
struct HybridAction {
  ActionKind kind;
  HybridNode node;  ///< For swa_rebuild and recover_swa_with_locked_full, else 0.
  I64Span a;
  I64Span b;
};

class HybridTree;

namespace detail {
/// Owns an rkv_hybrid; HybridTree and its HybridLocks share it (the locks weakly), so a
/// lock never calls into a freed tree.
struct HybridHandle {
  rkv_hybrid *h = nullptr;
  explicit HybridHandle(rkv_hybrid *p) noexcept : h(p) {}
  HybridHandle(const HybridHandle &) = delete;
  HybridHandle &operator=(const HybridHandle &) = delete;
  ~HybridHandle() { rkv_hybrid_free(h); }
};

/// Calls a free callback `F(Component, const int64_t *, size_t)` from C: the first
/// exception is kept (later calls still run, so no index is lost) and rethrown after.
template <class F>
struct FreeCtx {
  F *f;
  std::exception_ptr error;
  static void tramp(void *p, std::uint32_t comp, const std::int64_t *v, std::size_t n) {
    FreeCtx *c = static_cast<FreeCtx *>(p);
    try {
      (*c->f)(static_cast<Component>(comp), v, n);
    } catch (...) {
      if (!c->error) c->error = std::current_exception();
    }
  }
};
}  // namespace detail

/// A request's lock over every component of a HybridTree (rkv_hybrid_receipt): move-only,
/// released by its destructor (errors ignored there) or by release() (which throws). An
/// empty HybridLock (default-made, moved from, released) holds nothing. A lock that
/// outlives its tree releases nothing. One thread at a time uses a lock; it may be moved
/// to and released from any thread.
class HybridLock {
 public:
  HybridLock() noexcept = default;
  HybridLock(const HybridLock &) = delete;
  HybridLock &operator=(const HybridLock &) = delete;
  HybridLock(HybridLock &&o) noexcept : tree_(std::move(o.tree_)), r_(std::exchange(o.r_, {})) {}
  HybridLock &operator=(HybridLock &&o) noexcept {
    if (this != &o) {
      reset();
      tree_ = std::move(o.tree_);
      r_ = std::exchange(o.r_, {});
    }
    return *this;
  }
  ~HybridLock() { reset(); }

  /// Whether it holds a lock.
  explicit operator bool() const noexcept { return r_.id != 0; }
  /// The node it is anchored on.
  HybridNode node() const noexcept { return r_.node; }
  /// The C receipt.
  const rkv_hybrid_receipt &receipt() const noexcept { return r_; }

  /// Releases it (rkv_hybrid_unlock); the lock is empty afterwards. Throws
  /// Error(RKV_INVALID_LOCK) for an empty lock, or one whose tree is gone or was reset.
  void release() {
    rkv_hybrid_receipt r = std::exchange(r_, {});
    std::shared_ptr<detail::HybridHandle> t = tree_.lock();
    tree_.reset();
    if (r.id == 0 || !t) {
      throw Error(RKV_INVALID_LOCK, "rkv_hybrid_unlock: this HybridLock holds no lock (empty, "
                                    "released, or its tree is gone)");
    }
    detail::check(rkv_hybrid_unlock(t->h, &r), "rkv_hybrid_unlock");
  }

  /// Releases the SWA window lock early, and the Mamba lock with it
  /// (rkv_hybrid_release_window, SGLang's dec_swa_lock_only); `on_free(Component, const
  /// int64_t *, size_t)` gets the SWA slots (by FULL index) that went at once. The FULL lock
  /// stays until release(). Exceptions from `on_free` are rethrown after the call.
  template <class F>
  void release_window(F &&on_free) {
    std::shared_ptr<detail::HybridHandle> t = tree_.lock();
    if (r_.id == 0 || !t) {
      throw Error(RKV_INVALID_LOCK, "rkv_hybrid_release_window: this HybridLock holds no lock");
    }
    detail::FreeCtx<std::remove_reference_t<F>> ctx{&on_free, nullptr};
    rkv_status st = rkv_hybrid_release_window(t->h, &r_, &decltype(ctx)::tramp, &ctx);
    if (ctx.error) std::rethrow_exception(ctx.error);
    detail::check(st, "rkv_hybrid_release_window");
  }

 private:
  friend class HybridTree;
  HybridLock(std::weak_ptr<detail::HybridHandle> t, const rkv_hybrid_receipt &r) noexcept
      : tree_(std::move(t)), r_(r) {}
  void reset() noexcept {
    if (r_.id == 0) return;
    if (std::shared_ptr<detail::HybridHandle> t = tree_.lock()) (void)rkv_hybrid_unlock(t->h, &r_);
    r_ = {};
    tree_.reset();
  }
  std::weak_ptr<detail::HybridHandle> tree_;
  rkv_hybrid_receipt r_{};
};

/// The rest of an insert's arguments (rkv_hybrid_insert).
struct HybridInsertArgs {
  std::size_t prev_prefix_len = 0;  ///< The prefix the request holds from its match.
  std::size_t swa_evicted_len = 0;  ///< SGLang's get_evicted_seqlen(SWA) (page multiple).
  I64Span mamba_state;              ///< The request's Mamba state (Mamba trees; empty: none).
  bool lock = false;                ///< Lock the node the key ends on (HybridInsert::lock).
  /// Call swa_refresh(node) after the actions when the insert had a barrier (the callback
  /// has stored the rebuilt SWA values by then). false: the caller refreshes.
  bool refresh = true;
};

/// What an insert did.
struct HybridInsert {
  std::size_t prefix_len = 0;  ///< Tokens the tree already held.
  HybridNode node = 0;         ///< The node the key ends on.
  bool refreshed = false;      ///< The C result's: the tree refreshed the window itself.
  bool mamba_exist = false;    ///< The node kept its state: the request's stays the caller's.
  HybridLock lock;             ///< With HybridInsertArgs::lock: the lock on `node`.
};

/// A match and its lock (HybridTree::match_lock).
struct HybridMatchLock {
  HybridMatch match;
  HybridLock lock;
};

/// A hybrid tree (rkv_hybrid): move-only, freed by its destructor (HybridLocks left over
/// then release nothing). Every const member may run from many threads at once (calls take
/// the tree's mutex in turn); constructing, assigning and destroying one must not race with
/// other calls on it. Callbacks run after the mutex is released, so they may call back
/// into the tree (an swa_rebuild action stores its values with swa_set_value). Failures
/// throw rkv::Error with the library's message.
class HybridTree {
 public:
  explicit HybridTree(const HybridOptions &o = HybridOptions()) {
    rkv_hybrid_options c = rkv_hybrid_options_default();
    c.page_size = o.page_size;
    c.swa_window = o.swa_window;
    c.mamba = o.mamba ? 1 : 0;
    c.first_id = o.first_id;
    rkv_hybrid *h = nullptr;
    detail::check(rkv_hybrid_new(&c, &h), "rkv_hybrid_new");
    h_ = std::make_shared<detail::HybridHandle>(h);
  }
  HybridTree(const HybridTree &) = delete;
  HybridTree &operator=(const HybridTree &) = delete;
  HybridTree(HybridTree &&) noexcept = default;
  HybridTree &operator=(HybridTree &&) noexcept = default;
  ~HybridTree() = default;

  /// Whether this object holds a tree (false once moved from).
  explicit operator bool() const noexcept { return h_ != nullptr; }
  /// The C handle, still owned by this object.
  const rkv_hybrid *get() const noexcept { return h_ ? h_->h : nullptr; }

  /// The root's node id.
  HybridNode root() const {
    HybridNode r = 0;
    detail::check(rkv_hybrid_root(need(), &r), "rkv_hybrid_root");
    return r;
  }

  /// SGLang's match_prefix of `key` in namespace `ns` (splits, stamps).
  HybridMatch match(std::uint32_t ns, I64Span key) const {
    HybridMatch m{};
    detail::check(rkv_hybrid_match(need(), ns, key.data, key.size, &m), "rkv_hybrid_match");
    return m;
  }
  /// match, then a lock on its last_device_node, atomically.
  HybridMatchLock match_lock(std::uint32_t ns, I64Span key) const {
    HybridMatchLock out{};
    rkv_hybrid_receipt r{};
    detail::check(rkv_hybrid_match_lock(need(), ns, key.data, key.size, &out.match, &r),
                  "rkv_hybrid_match_lock");
    out.lock = HybridLock(h_, r);
    return out;
  }
  /// Locks `node` over every component (FULL path, SWA window, Mamba node).
  HybridLock lock(HybridNode node) const {
    rkv_hybrid_receipt r{};
    detail::check(rkv_hybrid_lock(need(), node, &r), "rkv_hybrid_lock");
    return HybridLock(h_, r);
  }

  /// The FULL indices from `from` up to, not including, its ancestor `until`, root order.
  std::vector<std::int64_t> collect(HybridNode from, HybridNode until) const {
    std::vector<std::int64_t> out(16);
    for (;;) {
      std::size_t n = 0;
      rkv_status st = rkv_hybrid_collect(need(), from, until, out.data(), out.size(), &n);
      if (st == RKV_BUFFER_TOO_SMALL) {
        out.resize(n);
        continue;
      }
      detail::check(st, "rkv_hybrid_collect");
      out.resize(n);
      return out;
    }
  }
  /// collect from `from` to the root.
  std::vector<std::int64_t> collect(HybridNode from) const { return collect(from, root()); }

  /// SGLang's insert over every component (rkv_hybrid_insert): `key` with its FULL indices
  /// `values`; `on_action(const HybridAction &)` is called for each cache action, in order,
  /// after the tree's mutex is released (it may call swa_set_value). Then, where the insert
  /// had a barrier and `args.refresh`, the window refresh. An exception from `on_action`
  /// does not stop the later actions (no index is lost); the first is rethrown after them
  /// (and the refresh is not done then; the lock, if asked for, is released).
  template <class F>
  HybridInsert insert(std::uint32_t ns, I64Span key, I64Span values, F &&on_action,
                      const HybridInsertArgs &args = HybridInsertArgs()) const {
    struct Ctx {
      std::remove_reference_t<F> *f;
      std::exception_ptr error;
    } ctx{&on_action, nullptr};
    void (*tramp)(void *, const rkv_hybrid_action *) = [](void *p, const rkv_hybrid_action *a) {
      Ctx *c = static_cast<Ctx *>(p);
      try {
        HybridAction x{static_cast<ActionKind>(a->kind), a->node, I64Span(a->a, a->a_len),
                       I64Span(a->b, a->b_len)};
        (*c->f)(static_cast<const HybridAction &>(x));
      } catch (...) {
        if (!c->error) c->error = std::current_exception();
      }
    };
    rkv_hybrid_insert_result r{};
    rkv_hybrid_receipt lk{};
    rkv_status st = rkv_hybrid_insert(need(), ns, key.data, key.size, values.data, values.size,
                                      args.prev_prefix_len, args.swa_evicted_len,
                                      args.mamba_state.data, args.mamba_state.size, tramp, &ctx,
                                      &r, args.lock ? &lk : nullptr);
    detail::check(st, "rkv_hybrid_insert");
    HybridInsert out;
    out.prefix_len = r.prefix_len;
    out.node = r.node;
    out.refreshed = r.refreshed != 0;
    out.mamba_exist = r.mamba_exist != 0;
    if (args.lock) out.lock = HybridLock(h_, lk);
    if (ctx.error) std::rethrow_exception(ctx.error);
    if (!out.refreshed && args.refresh) swa_refresh(out.node);
    return out;
  }

  /// Stores `node`'s SWA value (what an swa_rebuild action asks).
  void swa_set_value(HybridNode node, I64Span swa) const {
    detail::check(rkv_hybrid_swa_set_value(need(), node, swa.data, swa.size),
                  "rkv_hybrid_swa_set_value");
  }
  /// The window refresh back from `node` that ends an insert with a barrier.
  void swa_refresh(HybridNode node) const {
    detail::check(rkv_hybrid_swa_refresh(need(), node), "rkv_hybrid_swa_refresh");
  }

  /// Runs `component`'s eviction walk for at least `request` (tokens; Mamba: states);
  /// `on_free(Component, const int64_t *, size_t)` gets everything freed (a leaf evicted
  /// whole: FULL, SWA by FULL index, Mamba). Returns the amount evicted of `component`.
  /// Exceptions from `on_free` are rethrown after the walk (every index still delivered).
  template <class F>
  std::uint64_t evict(Component component, std::uint64_t request, F &&on_free) const {
    detail::FreeCtx<std::remove_reference_t<F>> ctx{&on_free, nullptr};
    std::uint64_t evicted = 0;
    rkv_status st = rkv_hybrid_evict(need(), static_cast<std::uint32_t>(component), request,
                                     &decltype(ctx)::tramp, &ctx, &evicted);
    if (ctx.error) std::rethrow_exception(ctx.error);
    detail::check(st, "rkv_hybrid_evict");
    return evicted;
  }

  /// SGLang's evict_excess_path_states with the cap `cap`: the states freed go to
  /// `on_free`; returns how many.
  template <class F>
  std::size_t mamba_evict_excess(HybridNode node, std::size_t cap, F &&on_free) const {
    detail::FreeCtx<std::remove_reference_t<F>> ctx{&on_free, nullptr};
    std::size_t n = 0;
    rkv_status st =
        rkv_hybrid_mamba_evict_excess(need(), node, cap, &decltype(ctx)::tramp, &ctx, &n);
    if (ctx.error) std::rethrow_exception(ctx.error);
    detail::check(st, "rkv_hybrid_mamba_evict_excess");
    return n;
  }

  /// Sizes per component.
  HybridSizes sizes() const {
    HybridSizes s{};
    detail::check(rkv_hybrid_sizes_get(need(), &s), "rkv_hybrid_sizes_get");
    return s;
  }
  /// Throws Error(RKV_INTERNAL_ERROR) saying what is inconsistent, if anything is.
  void check() const { detail::check(rkv_hybrid_check(need()), "rkv_hybrid_check"); }

  /// Drops every node (locks left become invalid); nothing reported.
  void reset() const {
    detail::check(rkv_hybrid_reset(need(), nullptr, nullptr), "rkv_hybrid_reset");
  }
  /// Drops every node; `on_free` gets everything the tree held.
  template <class F>
  void reset(F &&on_free) const {
    detail::FreeCtx<std::remove_reference_t<F>> ctx{&on_free, nullptr};
    rkv_status st = rkv_hybrid_reset(need(), &decltype(ctx)::tramp, &ctx);
    if (ctx.error) std::rethrow_exception(ctx.error);
    detail::check(st, "rkv_hybrid_reset");
  }

 private:
  const rkv_hybrid *need() const {
    if (!h_) throw Error(RKV_NULL_ARGUMENT, "rkv::HybridTree: moved from");
    return h_->h;
  }
  std::shared_ptr<detail::HybridHandle> h_;
};

}  // namespace rkv

#endif  // RADIXKV_HYBRID_HPP
