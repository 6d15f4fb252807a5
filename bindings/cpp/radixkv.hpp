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
// Hybrid models (SGLang's UnifiedRadixCache tree: FULL, SWA, Mamba):
// rkv::HybridTree tree(rkv::HybridOptions{/*page_size=*/16, /*swa_window=*/4096, /*mamba=*/true});
// tree.match_lock(ns, key) gives the reusable prefix and an RAII rkv::HybridLock over every
// component; tree.insert(ns, key, values, on_action, args) reports the cache actions (free
// indices, rebuild SWA values with tree.swa_set_value) to a callback; tree.evict(component, n,
// on_free) runs one component's eviction walk.
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

// The C ABI, beside this header.
#include "radixkv.h"

// The pieces, in order (radixkv/ beside this header); each includes what it needs.
#include "radixkv/base.hpp"
#include "radixkv/events.hpp"
#include "radixkv/lock.hpp"
#include "radixkv/request.hpp"
#include "radixkv/cache.hpp"
#include "radixkv/tier.hpp"
#include "radixkv/router.hpp"
#include "radixkv/hybrid.hpp"

#endif  // RADIXKV_HPP
