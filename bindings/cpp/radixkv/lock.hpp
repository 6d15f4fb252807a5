// radixkv C++17 bindings, one piece of radixkv.hpp (include that one, not this): rkv::Lock
// (a pin on a prefix of a Cache) and what the Cache's calls return with one: InsertLock,
// Lookup, Loaded.
// It includes what it needs, so it also compiles alone.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef RADIXKV_LOCK_HPP
#define RADIXKV_LOCK_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base.hpp"

namespace rkv {

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

}  // namespace rkv

#endif  // RADIXKV_LOCK_HPP
