// radixkv C++17 bindings, one piece of radixkv.hpp (include that one, not this): the router
// index (ROUTER.md): GapPolicy, RouterOptions, Worker, RouterScore, RouterStats,
// RouterNamespace and rkv::RouterIndex.
// It includes what it needs, so it also compiles alone.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef RADIXKV_ROUTER_HPP
#define RADIXKV_ROUTER_HPP

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base.hpp"
#include "events.hpp"

namespace rkv {

// ---------------------------------------------------------------------------------------
// The router index (ROUTER.md): many engine workers' KV caches in one lock-free index, fed
// by their KV-event streams, asked per request how many leading blocks each worker holds.

/// What a gap in a worker's batch seq does (rkv_gap_policy).
enum class GapPolicy : std::uint32_t {
  clear = RKV_GAP_CLEAR,   ///< Clear the worker (it is re-learned), then apply (the default).
  refuse = RKV_GAP_REFUSE  ///< Apply nothing: Error(RKV_SEQUENCE_GAP); replay from next_seq().
};

/// Settings of a RouterIndex (rkv_router_options).
struct RouterOptions {
  std::uint32_t block_size = 16;    ///< Tokens per block (every worker's block_size), >= 1.
  std::uint32_t max_workers = 4096;  ///< Live (worker_id, dp_rank) pairs at most, 1 to 2^29.
  GapPolicy gap_policy = GapPolicy::clear;
};

/// An engine worker: {worker_id, dp_rank, reserved = 0} (rkv_worker).
using Worker = rkv_worker;
/// The worker (worker_id, dp_rank).
inline Worker make_worker(std::uint64_t worker_id, std::uint32_t dp_rank = 0) noexcept {
  Worker w{};
  w.worker_id = worker_id;
  w.dp_rank = dp_rank;
  return w;
}
/// One worker's answer to RouterIndex::find: worker, device_blocks, any_blocks
/// (rkv_router_score).
using RouterScore = rkv_router_score;
/// A RouterIndex's counts and counters (rkv_router_stats): workers, blocks, memberships,
/// bytes, events, batches, gaps, restarts, refused.
using RouterStats = rkv_router_stats;
/// RouterStats and the counters added since (rkv_router_stats_ex, versioned by size):
/// today other_groups, the events skipped for their KV cache group (RouterIndex::stats_ex).
using RouterStatsEx = rkv_router_stats_ex;

/// A namespace of the router's content hashes: the LoRA name and cache salt as the KV events
/// carry them (none: the plain namespace).
struct RouterNamespace {
  std::optional<std::string> lora_name;
  std::optional<std::string> cache_salt;
};

/// A router index (rkv_router): move-only, freed by its destructor. Every const member may
/// run from many threads at once (events of different workers apply in parallel; finds take
/// no lock); constructing, assigning and destroying one must not race with other calls on
/// it. Failures throw rkv::Error with the library's message; the refusals a router expects
/// come back as values where the C call has a "not there" answer (remove_worker: false,
/// next_seq: std::nullopt).
class RouterIndex {
 public:
  /// An empty index (Error(RKV_INVALID_ARGUMENT) for out-of-range options).
  explicit RouterIndex(const RouterOptions &o = RouterOptions()) : opts_(o) {
    const rkv_router_options c = c_options(o);
    detail::check(rkv_router_new(&c, &r_), "rkv_router_new");
  }
  /// The index a dump() made (by an index of the same block_size) describes.
  static RouterIndex restore(const RouterOptions &o, const std::vector<std::uint8_t> &bytes) {
    const rkv_router_options c = c_options(o);
    rkv_router *r = nullptr;
    detail::check(rkv_router_restore(&c, bytes.data(), bytes.size(), &r), "rkv_router_restore");
    return RouterIndex(r, o);
  }
  RouterIndex(const RouterIndex &) = delete;
  RouterIndex &operator=(const RouterIndex &) = delete;
  RouterIndex(RouterIndex &&o) noexcept : r_(std::exchange(o.r_, nullptr)), opts_(o.opts_) {}
  RouterIndex &operator=(RouterIndex &&o) noexcept {
    if (this != &o) {
      rkv_router_free(r_);
      r_ = std::exchange(o.r_, nullptr);
      opts_ = o.opts_;
    }
    return *this;
  }
  ~RouterIndex() { rkv_router_free(r_); }

  /// Whether this object holds an index (false once moved from).
  explicit operator bool() const noexcept { return r_ != nullptr; }
  /// The C handle, still owned by this object.
  rkv_router *get() const noexcept { return r_; }
  /// The options it was made with.
  const RouterOptions &options() const noexcept { return opts_; }

  /// Applies one vLLM KV-event batch (the msgpack payload frame) numbered `seq` from
  /// publisher `worker_id` (rkv_router_apply_batch). A malformed payload throws
  /// Error(RKV_INVALID_ARGUMENT), nothing applied; a gap under GapPolicy::refuse throws
  /// Error(RKV_SEQUENCE_GAP), nothing applied: replay from next_seq(), then retry.
  void apply_batch(std::uint64_t worker_id, std::uint64_t seq, const std::uint8_t *payload,
                   std::size_t len) const {
    detail::check(rkv_router_apply_batch(need(), worker_id, seq, payload, len),
                  "rkv_router_apply_batch");
  }
  /// apply_batch of a whole buffer.
  void apply_batch(std::uint64_t worker_id, std::uint64_t seq,
                   const std::vector<std::uint8_t> &payload) const {
    apply_batch(worker_id, seq, payload.data(), payload.size());
  }

  /// BlockStored: `w` stores blocks `block_hashes` (its engine hashes) with `tokens`
  /// (block_size per block: else Error(RKV_INVALID_ARGUMENT)) below its block `parent`
  /// (none: the namespace's first), in `medium` and namespace `ns`. An unknown parent
  /// throws Error(RKV_INVALID_ARGUMENT), nothing applied.
  void stored(const Worker &w, std::optional<std::uint64_t> parent,
              const std::vector<std::uint64_t> &block_hashes, Span tokens,
              Medium medium = Medium::gpu, const RouterNamespace &ns = RouterNamespace()) const {
    const rkv_router *r = need();
    const std::size_t want = block_hashes.size() * opts_.block_size;
    if (tokens.size != want) {
      throw Error(RKV_INVALID_ARGUMENT,
                  "rkv_router_stored: " + std::to_string(tokens.size) + " tokens for " +
                      std::to_string(block_hashes.size()) + " blocks of " +
                      std::to_string(opts_.block_size) + " tokens (want " +
                      std::to_string(want) + ")");
    }
    const char *lora = c_str(ns.lora_name, "rkv_router_stored", "lora_name");
    const char *salt = c_str(ns.cache_salt, "rkv_router_stored", "cache_salt");
    detail::check(rkv_router_stored(r, w, lora, salt, parent ? &*parent : nullptr,
                                    block_hashes.data(), block_hashes.size(), tokens.data,
                                    static_cast<std::uint32_t>(medium)),
                  "rkv_router_stored");
  }
  /// BlockRemoved: `w` dropped its `medium` copy of `block_hashes`. Hashes it does not hold
  /// there throw Error(RKV_INVALID_ARGUMENT) after the held ones were removed.
  void removed(const Worker &w, const std::vector<std::uint64_t> &block_hashes,
               Medium medium = Medium::gpu) const {
    detail::check(rkv_router_removed(need(), w, block_hashes.data(), block_hashes.size(),
                                     static_cast<std::uint32_t>(medium)),
                  "rkv_router_removed");
  }
  /// AllBlocksCleared: `w` holds nothing (its batch cursor is kept).
  void cleared(const Worker &w) const {
    detail::check(rkv_router_cleared(need(), w), "rkv_router_cleared");
  }
  /// Forgets `w` (its blocks and cursor); false if the index did not know it.
  bool remove_worker(const Worker &w) const {
    rkv_status st = rkv_router_remove_worker(need(), w);
    if (st == RKV_NOT_FOUND) return false;
    detail::check(st, "rkv_router_remove_worker");
    return true;
  }
  /// The seq `w`'s batch cursor expects next; std::nullopt for a worker without one
  /// (unknown, or no batch applied yet: its next batch sets it).
  std::optional<std::uint64_t> next_seq(const Worker &w) const {
    std::uint64_t next = 0;
    rkv_status st = rkv_router_next_seq(need(), w, &next);
    if (st == RKV_NOT_FOUND) return std::nullopt;
    detail::check(st, "rkv_router_next_seq");
    return next;
  }

  /// Scores of `tokens` in namespace `ns`: every worker holding the first block, once.
  std::vector<RouterScore> find(Span tokens, const RouterNamespace &ns = RouterNamespace()) const {
    std::vector<RouterScore> out;
    find(tokens, out, ns);
    return out;
  }
  /// find into `out` (replaced): uses its capacity, reallocating only when the scores do
  /// not fit, so a reused vector makes a find allocation-free.
  void find(Span tokens, std::vector<RouterScore> &out,
            const RouterNamespace &ns = RouterNamespace()) const {
    const rkv_router *r = need();
    const char *lora = c_str(ns.lora_name, "rkv_router_find", "lora_name");
    const char *salt = c_str(ns.cache_salt, "rkv_router_find", "cache_salt");
    fill(out, "rkv_router_find", [&](RouterScore *p, std::size_t cap, std::size_t *len) {
      return rkv_router_find(r, tokens.data, tokens.size, lora, salt, p, cap, len);
    });
  }
  /// Scores of precomputed content hashes (one per block, namespace mixed in).
  std::vector<RouterScore> find_hashes(const std::vector<std::uint64_t> &content_hashes) const {
    std::vector<RouterScore> out;
    find_hashes(content_hashes, out);
    return out;
  }
  /// find_hashes into `out`, as find.
  void find_hashes(const std::vector<std::uint64_t> &content_hashes,
                   std::vector<RouterScore> &out) const {
    const rkv_router *r = need();
    fill(out, "rkv_router_find_hashes", [&](RouterScore *p, std::size_t cap, std::size_t *len) {
      return rkv_router_find_hashes(r, content_hashes.data(), content_hashes.size(), p, cap,
                                    len);
    });
  }

  /// Counts and counters (each read atomically, not one snapshot under writers).
  RouterStats stats() const {
    RouterStats s{};
    detail::check(rkv_router_stats_get(need(), &s), "rkv_router_stats_get");
    return s;
  }
  /// stats() and the counters added since: other_groups, events skipped for their KV cache
  /// group (a sliding-window or Mamba group's, not refused). rkv_router_stats_get_ex.
  RouterStatsEx stats_ex() const {
    RouterStatsEx s{};
    s.size = sizeof s;
    detail::check(rkv_router_stats_get_ex(need(), &s), "rkv_router_stats_get_ex");
    return s;
  }
  /// The whole index as bytes (rkv_router_dump) for restore().
  std::vector<std::uint8_t> dump() const {
    const rkv_router *r = need();
    std::vector<std::uint8_t> out;
    for (;;) {
      std::size_t len = 0;
      rkv_status st = rkv_router_dump(r, out.data(), out.size(), &len);
      if (st == RKV_BUFFER_TOO_SMALL) {  // grew meanwhile: try again with the new size
        out.resize(len);
        continue;
      }
      detail::check(st, "rkv_router_dump");
      out.resize(len);
      return out;
    }
  }

 private:
  RouterIndex(rkv_router *r, const RouterOptions &o) noexcept : r_(r), opts_(o) {}
  static rkv_router_options c_options(const RouterOptions &o) noexcept {
    rkv_router_options c = rkv_router_options_default();
    c.block_size = o.block_size;
    c.max_workers = o.max_workers;
    c.gap_policy = static_cast<std::uint32_t>(o.gap_policy);
    return c;
  }
  static const char *c_str(const std::optional<std::string> &s, const char *function,
                           const char *name) {
    if (!s) return nullptr;
    if (s->find('\0') != std::string::npos) {
      throw Error(RKV_INVALID_ARGUMENT,
                  std::string(function) + ": " + name + " contains a NUL character");
    }
    return s->c_str();
  }
  // Runs a C find into `out`'s capacity, growing it when the scores do not fit.
  template <class F>
  static void fill(std::vector<RouterScore> &out, const char *function, F call) {
    if (out.capacity() == 0) out.reserve(8);
    out.resize(out.capacity());
    for (;;) {
      std::size_t len = 0;
      rkv_status st = call(out.data(), out.size(), &len);
      if (st == RKV_BUFFER_TOO_SMALL) {
        out.resize(len);
        continue;
      }
      if (st != RKV_OK) {
        out.clear();
        throw Error::last(st, function);
      }
      out.resize(len);
      return;
    }
  }
  const rkv_router *need() const {
    if (r_ == nullptr) {
      throw Error(RKV_NULL_ARGUMENT, std::string("rkv_router: this rkv::RouterIndex is empty "
                                                 "(moved from)"));
    }
    return r_;
  }

  rkv_router *r_ = nullptr;
  RouterOptions opts_;
};

}  // namespace rkv

#endif  // RADIXKV_ROUTER_HPP
