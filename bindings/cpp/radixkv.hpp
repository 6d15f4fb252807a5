// radixkv C++17 bindings: header-only, over the C ABI of include/radixkv.h.
//
//   rkv::Cache cache(rkv::Options{/*page_size=*/1, rkv::Policy::lru, /*pool_slots=*/4096});
//   // (any policy: rkv::Policy::priority, rkv::parse_policy("slru"), Options::slru_threshold)
//   rkv::Lock lock = cache.match_lock(ns, tokens);         // pins lock.slots()
//   std::vector<uint32_t> fresh = cache.alloc(tokens.size() - lock.length());
//   ...
//   cache.insert(ns, tokens, slots);                        // or insert_lock
//   cache.insert(ns, tokens, slots, {/*priority=*/5});      // rkv::InsertOptions
//   lock.release();                                         // or let it go out of scope
//
// A host memory tier behind the pool: rkv::Cache cache(opts, rkv::HostOptions{/*host_slots=*/
// 4096}); cache.lookup_lock(ns, tokens) gives the pinned device prefix and host_len, and
// cache.load_wait(cache.load_back(ns, tokens)) brings the host part back (rkv::Loaded).
//
// KV events (vLLM's stream, for cluster routers): cache.enable_events() right after
// construction, then cache.flush_events() once per scheduler step and either
// cache.drain_events() (typed rkv::Events) or rkv::Publisher p = cache.publish({"tcp://*:5557"})
// (an RAII ZMQ publisher that stops and frees itself when destroyed; it may outlive the
// Cache).
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
// Router index (ROUTER.md): rkv::RouterIndex router(rkv::RouterOptions{/*block_size=*/16});
// router.apply_batch(worker_id, seq, payload) per vLLM KV-event batch (or stored / removed /
// cleared), then router.find(tokens) gives each worker's leading blocks held
// (rkv::RouterScore); router.dump() / rkv::RouterIndex::restore(opts, bytes) snapshot it.
//
// Thread-safety: every const member function of rkv::Cache may run from many threads at
// once (they map to the C functions that take `const rkv_cache *`); constructing,
// assigning and destroying a Cache, enable_events and clear must not race with other calls
// on it. A Lock is a plain
// object: one thread at a time uses it, but it may be moved to and released from any
// thread, also while another thread destroys its Cache.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef RADIXKV_HPP
#define RADIXKV_HPP

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
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

/// What Cache::lookup and Cache::lookup_lock matched (rkv_match_ex): the device prefix's
/// slots and how far a host tier extends it.
struct Lookup {
  std::vector<std::uint32_t> slots;  ///< The device prefix's slots (device_len() of them).
  std::size_t host_len = 0;          ///< Host tokens right after it (0 without a tier).
  Lock lock;                         ///< lookup_lock only: pins the device prefix.
  std::size_t device_len() const noexcept { return slots.size(); }
};

/// A finished load-back of a Cache with a host tier (Cache::load_wait / load_poll).
struct Loaded {
  Lock lock;                         ///< Pins the device prefix with the loaded pages.
  std::vector<std::uint32_t> slots;  ///< Its slots.
  std::size_t device_len = 0;        ///< Tokens that were on the device before.
  std::size_t loaded = 0;            ///< Tokens loaded from the host.
  rkv_load_outcome outcome = RKV_LOAD_NOTHING_ON_HOST;
};

/// One request's trip through a pooled Cache (rkv_request, the core's request cycle):
/// Cache::admit pins the longest cached prefix and allocates slots for the rest; extend
/// appends tokens (slots page by page); checkpoint makes the prefix so far visible to other
/// requests; finish caches prompt + output and ends it; abort gives everything back.
/// Move-only RAII: an unfinished Request is aborted by its destructor (its slots go back
/// to the pool, its pin is released). An empty Request (default-constructed, moved-from,
/// finished or aborted) holds nothing. It may outlive its Cache: destroying the Cache
/// aborts it, and then every call throws Error(RKV_INVALID_ARGUMENT) and the destructor
/// only frees the handle. Calls on one Request are thread-safe (run one at a time).
class Request {
 public:
  Request() noexcept = default;
  Request(const Request &) = delete;
  Request &operator=(const Request &) = delete;
  Request(Request &&o) noexcept
      : cache_(std::move(o.cache_)), req_(std::exchange(o.req_, nullptr)) {}
  Request &operator=(Request &&o) noexcept {
    if (this != &o) {
      abort();
      cache_ = std::move(o.cache_);
      req_ = std::exchange(o.req_, nullptr);
    }
    return *this;
  }
  /// Aborts the request if it is unfinished.
  ~Request() { abort(); }

  /// Whether this Request holds a request (false once finished, aborted or moved from).
  explicit operator bool() const noexcept { return req_ != nullptr; }
  /// The C handle (NULL when empty); still owned by this object.
  const rkv_request *get() const noexcept { return req_; }

  /// Its lengths and namespace now (rkv_request_info_get).
  rkv_request_info info() const {
    rkv_request_info i{};
    auto c = hold("rkv_request_info_get");
    detail::check(rkv_request_info_get(req_, &i), "rkv_request_info_get");
    return i;
  }
  /// Tokens so far (prompt, then whatever extend added).
  std::size_t size() const { return info().len; }
  /// Tokens found cached at admission (their KV need not be computed).
  std::size_t cached_len() const { return info().cached_len; }
  /// Tokens pinned in the tree for it: slots()[0..locked_len()] belong to the tree.
  std::size_t locked_len() const { return info().locked_len; }
  /// One slot per token: where each token's KV entry lives or is to be written.
  std::vector<std::uint32_t> slots() const {
    auto c = hold("rkv_request_slots");
    std::vector<std::uint32_t> out(info().len);
    for (;;) {
      std::size_t len = 0;
      rkv_status st = rkv_request_slots(req_, out.data(), out.size(), &len);
      if (st == RKV_BUFFER_TOO_SMALL) {
        out.resize(len);
        continue;
      }
      detail::check(st, "rkv_request_slots");
      out.resize(len);
      return out;
    }
  }
  /// Appends tokens, allocating slots page by page (may evict); on an error (e.g.
  /// RKV_OUT_OF_SLOTS) nothing changes.
  void extend(Span tokens) {
    auto c = hold("rkv_request_extend");
    detail::check(rkv_request_extend(req_, tokens.data, tokens.size), "rkv_request_extend");
  }
  /// Inserts and pins the page-aligned prefix so far (others can hit it now); returns the
  /// tokens that were cached already.
  std::size_t checkpoint() {
    auto c = hold("rkv_request_checkpoint");
    std::size_t e = 0;
    detail::check(rkv_request_checkpoint(req_, &e), "rkv_request_checkpoint");
    return e;
  }
  /// Caches prompt + output, gives back duplicate and spare slots, releases the pin;
  /// returns the tokens that were cached already. The Request is empty afterwards, also
  /// when this throws (the request is aborted then).
  std::size_t finish() {
    std::shared_ptr<rkv_cache> c;
    try {
      c = hold("rkv_request_finish");
    } catch (...) {
      abort();  // its Cache was destroyed: only the handle is left to free
      throw;
    }
    std::size_t e = 0;
    rkv_status st = rkv_request_finish(std::exchange(req_, nullptr), &e);
    cache_.reset();
    detail::check(st, "rkv_request_finish");
    return e;
  }
  /// Gives back every slot it holds and releases its pin, caching nothing new; the Request
  /// is empty afterwards. A no-op on an empty Request.
  void abort() noexcept {
    if (req_ != nullptr) {
      // The shared_ptr keeps the cache alive for the call; with the Cache gone (or being
      // destroyed on another thread) rkv_request_abort only frees the handle, or waits for
      // the free that aborts it (it may run concurrently with rkv_cache_free).
      std::shared_ptr<rkv_cache> c = cache_.lock();
      rkv_request_abort(std::exchange(req_, nullptr));
    }
    cache_.reset();
  }

 private:
  friend class Cache;
  Request(std::weak_ptr<rkv_cache> c, rkv_request *r) noexcept : cache_(std::move(c)), req_(r) {}
  // The cache, kept alive for a call; throws when empty or when the Cache was destroyed.
  std::shared_ptr<rkv_cache> hold(const char *function) const {
    if (req_ == nullptr) {
      throw Error(RKV_NULL_ARGUMENT, std::string(function) +
                                         ": this rkv::Request is empty (finished, aborted or "
                                         "moved from)");
    }
    std::shared_ptr<rkv_cache> c = cache_.lock();
    if (!c) {
      throw Error(RKV_INVALID_ARGUMENT, std::string(function) +
                                            ": the rkv::Cache of this request was destroyed, "
                                            "which aborted the request");
    }
    return c;
  }

  std::weak_ptr<rkv_cache> cache_;
  rkv_request *req_ = nullptr;
};

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

  /// Starts a ZMQ publisher of this cache's events (rkv_events_publish): a bad endpoint is
  /// Error(RKV_INVALID_ARGUMENT), an address in use Error(RKV_IO_ERROR), and then nothing
  /// changed. The Publisher stops itself when destroyed, and may outlive this Cache.
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
    rkv_publisher *p = nullptr;
    detail::check(rkv_events_publish(cache_, &opts, &p), "rkv_events_publish");
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

#endif  // RADIXKV_HPP
