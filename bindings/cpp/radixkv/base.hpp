// radixkv C++17 bindings, one piece of radixkv.hpp (include that one, not this): the C ABI
// (radixkv.h), rkv::Error, version(), the eviction Policy, Options, InsertOptions, HostOptions,
// the stats aliases and Span: what the other pieces build on.
// It includes what it needs, so it also compiles alone.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef RADIXKV_BASE_HPP
#define RADIXKV_BASE_HPP

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

// The C ABI. radixkv.hpp includes it from beside itself first; a piece included alone
// finds it through the include path (-I .../include, as pkg-config and CMake set it).
#ifndef RADIXKV_H
#include "radixkv.h"
#endif

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

/// Eviction order (rkv_eviction_policy; the keys are SGLang's, see docs/eviction.md):
/// unpinned leaves go smallest key first.
enum class Policy : std::uint32_t {
  lru = RKV_EVICT_LRU,            ///< Least recently accessed first (the default).
  fifo = RKV_EVICT_FIFO,          ///< Oldest inserted first, accesses ignored.
  lfu = RKV_EVICT_LFU,            ///< Fewest hits first, then least recently accessed.
  mru = RKV_EVICT_MRU,            ///< Most recently accessed first.
  filo = RKV_EVICT_FILO,          ///< Newest inserted first, accesses ignored.
  priority = RKV_EVICT_PRIORITY,  ///< Lowest priority first (InsertOptions::priority).
  slru = RKV_EVICT_SLRU           ///< Hits < Options::slru_threshold first, LRU within.
};

/// The policy's name as SGLang's --radix-eviction-policy spells it ("lru", "lfu", ...).
inline std::string policy_name(Policy p) {
  const char *n = rkv_eviction_policy_name(static_cast<std::uint32_t>(p));
  if (n == nullptr) {
    throw Error(RKV_INVALID_ARGUMENT, "rkv_eviction_policy_name: " +
                                          std::to_string(static_cast<std::uint32_t>(p)) +
                                          " is not an rkv_eviction_policy");
  }
  return n;
}

/// The policy named `name` (ASCII case ignored): Error(RKV_INVALID_ARGUMENT), listing the
/// valid names, for an unknown one.
inline Policy parse_policy(const std::string &name) {
  std::uint32_t p = 0;
  detail::check(rkv_eviction_policy_from_name(name.c_str(), &p), "rkv_eviction_policy_from_name");
  return static_cast<Policy>(p);
}

/// Options of a new cache (see rkv_options and rkv_policy_options).
struct Options {
  std::uint32_t page_size = 1;
  Policy policy = Policy::lru;
  std::uint64_t pool_slots = 0;  ///< 0: caller-managed slots; N: built-in pool of N slots.
  /// Policy::slru's threshold: a node with at least this many hits is protected (0: every
  /// node, which is LRU). Ignored by the other policies.
  std::uint32_t slru_threshold = RKV_DEFAULT_SLRU_THRESHOLD;
  /// The sliding window of a hybrid model's SWA layers, in tokens (0: none). With one,
  /// matches are SWA-valid prefixes, locks hold their window's SWA KV, and evictions go
  /// through Cache::evict_kv (the others then need a callback; alloc does not evict).
  std::uint32_t swa_window = 0;
};

/// Which KV Cache::evict_kv frees (rkv_evict_target).
enum class EvictTarget : std::uint32_t {
  full = RKV_EVICT_TARGET_FULL,  ///< Unpinned leaves in the policy's order (as evict).
  swa = RKV_EVICT_TARGET_SWA     ///< SWA KV without a window lock, least recently used first.
};

/// Per-insert options (see rkv_insert_options), for the insert overloads that take them:
/// `cache.insert(ns, tokens, slots, {/*priority=*/5})`.
struct InsertOptions {
  /// Eviction priority under Policy::priority (higher stays longer; default 0): the nodes
  /// of the inserted path take the larger of theirs and this. Must fit an int32_t, else
  /// Error(RKV_INVALID_ARGUMENT) and nothing changes.
  std::int64_t priority = 0;
  /// Tokens of this key the same request inserted before (0 for its first insert): the
  /// nodes ending within them count no hit under Policy::lfu and Policy::slru, so a
  /// request inserting its growing prefix several times counts each node once.
  std::uint64_t inserted_len = 0;
};

/// Counts and counters (rkv_stats).
using Stats = rkv_stats;

/// When a page gets its host copy (rkv_write_policy; SGLang's --hicache-write-policy).
enum class WritePolicy : std::uint32_t {
  write_through = RKV_WRITE_THROUGH,                      ///< On its first insert.
  write_through_selective = RKV_WRITE_THROUGH_SELECTIVE,  ///< After write_threshold hits.
  write_back = RKV_WRITE_BACK                             ///< When the device evicts it.
};

/// What copies KV bytes between the pools (rkv_copier_kind).
enum class CopierKind : std::uint32_t {
  none = RKV_COPIER_NONE,         ///< Index only: no bytes.
  host = RKV_COPIER_HOST,         ///< Two host stores the tier allocates (TieredCache::kv).
  callback = RKV_COPIER_CALLBACK  ///< TierOptions::callbacks (the engine copies itself).
};

/// A host memory tier behind a Cache's pool (rkv_tier_options without the device's
/// options): `rkv::Cache cache(opts, rkv::HostOptions{...})` (rkv_cache_new_host; the cache
/// needs its pool, Options::pool_slots > 0). A plain value.
struct HostOptions {
  std::uint64_t host_slots = 0;  ///< Host slots (required: a positive multiple of page_size).
  WritePolicy write_policy = WritePolicy::write_through_selective;
  std::uint32_t write_threshold = 2;  ///< write_through_selective's hit count.
  std::uint64_t load_back_min = 1;    ///< Shorter load-backs are not done.
  /// The host eviction order; RKV_HOST_POLICY_SAME_AS_DEVICE (the default) or a Policy.
  std::uint32_t host_policy = RKV_HOST_POLICY_SAME_AS_DEVICE;
  /// CopierKind::none or CopierKind::callback (CopierKind::host's stores are reachable only
  /// through a TieredCache, so a Cache refuses nothing but cannot show them).
  CopierKind copier = CopierKind::none;
  /// CopierKind::host's layout (per token and layer: num_kv_heads * head_dim elements).
  std::uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 0, elem_bytes = 0;
  /// CopierKind::callback's functions (see rkv_copier: thread-safe, valid until the Cache
  /// is destroyed, must not throw).
  rkv_copier callbacks{};
};

/// Counts and counters of a host tier (rkv_tier_stats: Cache::tier_stats,
/// TieredCache::stats).
using TierStats = rkv_tier_stats;

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

}  // namespace rkv

#endif  // RADIXKV_BASE_HPP
