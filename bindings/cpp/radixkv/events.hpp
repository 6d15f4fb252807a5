// radixkv C++17 bindings, one piece of radixkv.hpp (include that one, not this): KV events:
// HashMode, Medium, EventKind, Encoding, KvCacheSpecKind, EventOptions, Event, PublisherOptions
// and the RAII
// rkv::Publisher (Cache::enable_events, drain_events, publish).
// It includes what it needs, so it also compiles alone.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef RADIXKV_EVENTS_HPP
#define RADIXKV_EVENTS_HPP

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base.hpp"

namespace rkv {

/// Which page hash KV events carry (rkv_hash_mode).
enum class HashMode : std::uint32_t {
  xxh3 = RKV_HASH_XXH3,                   ///< Dynamo / Mooncake XXH3-64 (the default).
  sglang_sha256 = RKV_HASH_SGLANG_SHA256  ///< SGLang's SHA-256 chain (hashes are int64 bits).
};

/// Where a cache's pages live (rkv_medium).
enum class Medium : std::uint32_t { gpu = RKV_MEDIUM_GPU, cpu_pinned = RKV_MEDIUM_CPU_PINNED };

/// What an Event is (rkv_event_kind).
enum class EventKind : std::uint32_t {
  block_stored = RKV_EVENT_BLOCK_STORED,
  block_removed = RKV_EVENT_BLOCK_REMOVED,
  all_blocks_cleared = RKV_EVENT_ALL_BLOCKS_CLEARED
};

/// How a Publisher encodes payloads (rkv_encoding).
enum class Encoding : std::uint32_t {
  vllm_array = RKV_ENCODING_VLLM_ARRAY,  ///< Tagged arrays, every field (the default).
  vllm_map = RKV_ENCODING_VLLM_MAP       ///< Tagged maps, default fields omitted.
};

/// A KV cache group's kind, vLLM's KVCacheSpecKind (rkv_kv_cache_spec_kind): published as
/// kv_cache_spec_kind in every BlockStored ("full_attention", "sliding_window", ...).
enum class KvCacheSpecKind : std::uint32_t {
  full_attention = RKV_KV_FULL_ATTENTION,  ///< The default.
  mla_attention = RKV_KV_MLA_ATTENTION,
  sliding_window = RKV_KV_SLIDING_WINDOW,          ///< Needs PublisherOptions::sliding_window.
  sliding_window_mla = RKV_KV_SLIDING_WINDOW_MLA,  ///< Needs PublisherOptions::sliding_window.
  mamba = RKV_KV_MAMBA,
  chunked_local_attention = RKV_KV_CHUNKED_LOCAL_ATTENTION,
  sink_full_attention = RKV_KV_SINK_FULL_ATTENTION,
  encoder_only_attention = RKV_KV_ENCODER_ONLY_ATTENTION,
  cross_attention = RKV_KV_CROSS_ATTENTION,
  unknown = RKV_KV_UNKNOWN
};

/// How a cache records KV events (see rkv_events_options and Cache::enable_events).
struct EventOptions {
  HashMode hash_mode = HashMode::xxh3;
  Medium medium = Medium::gpu;
  std::uint64_t max_drain_batches = 65536;  ///< Closed batches kept for drain_events.
};

/// One KV event, owning its data (copied out of rkv_events_drain's buffers).
struct Event {
  std::uint64_t seq = 0;  ///< Its batch's sequence number (0, 1, 2, ... per cache).
  double ts = 0;          ///< When its batch closed, seconds since the Unix epoch.
  EventKind kind = EventKind::all_blocks_cleared;
  Medium medium = Medium::gpu;
  std::vector<std::uint64_t> block_hashes;          ///< One per page, in token order.
  std::optional<std::uint64_t> parent_block_hash;   ///< block_stored after a cached page.
  std::vector<std::uint32_t> token_ids;             ///< block_stored: the new pages' tokens.
  std::uint32_t block_size = 0;                     ///< block_stored: the page size.
  std::optional<std::string> lora_name;             ///< block_stored: the namespace's.
  std::optional<std::string> cache_salt;            ///< block_stored: as published.
};

/// A cache's event counters (rkv_events_stats): batches, events, dropped.
using EventStats = rkv_events_stats;
/// A publisher's counters (rkv_publisher_stats): published, dropped, replayed,
/// replay_requests.
using PublisherStats = rkv_publisher_stats;

/// Settings of Cache::publish (see rkv_publisher_options); the defaults are vLLM's.
struct PublisherOptions {
  /// PUB endpoint: binds when it has a '*' or is ipc://, connects otherwise.
  std::string endpoint = "tcp://*:5557";
  std::optional<std::string> replay_endpoint;  ///< ROUTER replay endpoint, if any.
  std::string topic;                           ///< Topic frame (empty by default).
  Encoding encoding = Encoding::vllm_array;
  std::uint64_t buffer_steps = 10000;  ///< Batches kept for replay.
  std::uint64_t max_queue = 100000;    ///< Batches waiting for the thread (>= 1).
  std::chrono::milliseconds auto_flush{10};  ///< 0: only flush_events closes batches.
  std::chrono::milliseconds linger{1000};    ///< Sockets kept open after stop().
  std::int64_t data_parallel_rank = 0;
  /// The KV cache group this cache holds (rkv_kv_group; a hybrid model keeps one cache per
  /// group): group_idx in every BlockStored and BlockRemoved, the kind and window in every
  /// BlockStored. The window (tokens, >= 1) is required with the two sliding kinds and
  /// refused with the others (Error(RKV_INVALID_ARGUMENT), nothing started). The defaults
  /// publish what rkv_events_publish does: group 0, full_attention, no window.
  std::uint32_t group_idx = 0;
  KvCacheSpecKind kv_cache_spec_kind = KvCacheSpecKind::full_attention;
  std::optional<std::uint32_t> sliding_window;
};

/// A running ZMQ publisher of one cache's KV events (Cache::publish): move-only, stops and
/// frees itself when destroyed (which blocks for its linger). It owns what it runs on, so
/// it may outlive its Cache. stats(), endpoint() and stop() may run from many threads at
/// once; destroying or assigning it must not race with other calls on it.
class Publisher {
 public:
  Publisher() noexcept = default;
  Publisher(const Publisher &) = delete;
  Publisher &operator=(const Publisher &) = delete;
  Publisher(Publisher &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Publisher &operator=(Publisher &&o) noexcept {
    if (this != &o) {
      rkv_publisher_free(p_);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~Publisher() { rkv_publisher_free(p_); }

  /// Whether this object holds a publisher (running or stopped).
  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// The C handle, still owned by this object.
  rkv_publisher *get() const noexcept { return p_; }

  /// The PUB endpoint as bound (a '*' port resolved) or as connected.
  std::string endpoint() const {
    const char *ep = nullptr, *replay = nullptr;
    detail::check(rkv_publisher_endpoint(need(), &ep, &replay), "rkv_publisher_endpoint");
    return ep ? ep : "";
  }
  /// The replay endpoint as bound, if there is one.
  std::optional<std::string> replay_endpoint() const {
    const char *ep = nullptr, *replay = nullptr;
    detail::check(rkv_publisher_endpoint(need(), &ep, &replay), "rkv_publisher_endpoint");
    if (!replay) return std::nullopt;
    return std::string(replay);
  }
  /// The counters (final once stopped); never waits.
  PublisherStats stats() const {
    PublisherStats s{};
    detail::check(rkv_publisher_counters(need(), &s), "rkv_publisher_counters");
    return s;
  }
  /// Flushes the cache's events, sends what is queued, lingers and closes the sockets; the
  /// cache's later batches go to drain_events again. A second stop does nothing.
  void stop() const { detail::check(rkv_publisher_stop(need()), "rkv_publisher_stop"); }

 private:
  friend class Cache;
  explicit Publisher(rkv_publisher *p) noexcept : p_(p) {}
  rkv_publisher *need() const {
    if (p_ == nullptr) {
      throw Error(RKV_NULL_ARGUMENT, std::string("rkv_publisher: this rkv::Publisher is empty "
                                                 "(default-constructed or moved from)"));
    }
    return p_;
  }
  rkv_publisher *p_ = nullptr;
};

}  // namespace rkv

#endif  // RADIXKV_EVENTS_HPP
