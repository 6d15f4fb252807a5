// radixkv C++17 bindings, one piece of radixkv.hpp (include that one, not this): rkv::Request
// (one request's trip through a pooled Cache, Cache::admit).
// It includes what it needs, so it also compiles alone.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef RADIXKV_REQUEST_HPP
#define RADIXKV_REQUEST_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base.hpp"

namespace rkv {

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

}  // namespace rkv

#endif  // RADIXKV_REQUEST_HPP
