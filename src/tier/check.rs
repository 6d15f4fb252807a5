//! Statistics and the quiescent invariant check of a [`Cache`] with a tier (its protocols: the module docs of [`super`]).

use super::*;

impl Tiered<'_> {
    /// Counts and counters; exact at quiescence.
    pub(crate) fn stats(&self) -> TierStats {
        let sh = &*self.shared;
        let p = sh.page_size as u64;
        let host = sh.host();
        let (pinned, resident, evictable) = host.counts();
        let c = &sh.counters;
        let r = |a: &StatU64| a.load(Ordering::Relaxed);
        TierStats {
            device: self.dev.stats(),
            host_slots: host.capacity_pages() as u64 * p,
            host_free_slots: host.free_pages() as u64 * p,
            host_backed_slots: host.backed_pages() as u64 * p,
            host_resident_pages: resident as u64,
            host_pinned_pages: pinned as u64,
            host_evictable_pages: evictable as u64,
            device_hit_tokens: r(&c.device_hit_tokens),
            host_hit_tokens: r(&c.host_hit_tokens),
            tokens_to_host: r(&c.tokens_to_host),
            tokens_written_back: r(&c.tokens_written_back),
            tokens_to_device: r(&c.tokens_to_device),
            copies_to_host: r(&c.copies_to_host),
            copies_to_device: r(&c.copies_to_device),
            copy_failures: r(&c.copy_failures),
            load_backs: r(&c.load_backs),
            load_backs_skipped: r(&c.load_backs_skipped),
            host_evicted_pages: r(&c.host_evicted_pages),
            in_flight: self.pending().len() as u64,
        }
    }

    /// Checks the invariants that hold at quiescence (call it with no copy in flight and
    /// no other thread using the cache): see the [module docs](super). Returns the first
    /// violation found.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        let sh = &*self.shared;
        if !self.pending().is_empty() {
            return Err("copies are still in flight (call wait_all first)".into());
        }
        let host = sh.host();
        host.check()?;
        let pool = self.dev.pool().expect("device pool");
        for (key, e) in host.entries() {
            if !e.ready {
                return Err(format!("host entry {key:?} is still writing at quiescence"));
            }
            if e.pins > 0 {
                return Err(format!("host entry {key:?} is still pinned at quiescence"));
            }
            if e.resident != NO_PAGE {
                let slot = e.resident * sh.page_size as u32;
                if pool.state(slot) != Some(SlotState::Cached) {
                    return Err(format!(
                        "host entry {key:?} names device page {} that is not cached",
                        e.resident
                    ));
                }
                let (id, _) = sh.page_id(e.resident);
                if id != *key {
                    return Err(format!("device page {} holds {id:?}, not {key:?}", e.resident));
                }
            }
        }
        // The other way round: a cached device page whose tokens have a host copy is that
        // copy's resident page (never a host-only copy, which host eviction could drop,
        // of a page the device holds), and is flagged BACKED. One window is allowed under
        // `write_back`: an eviction's write-back of a page's old device copy reserves its
        // entry only after the page left the device, so an insert caching the page again
        // in between finds no entry to mark, and the write-back commits a host-only copy of
        // a page the device holds again. Harmless (the device copy is complete; if host
        // eviction drops the host copy, the page is written back again when the device
        // evicts it), and documented in docs/host-tier.md.
        // And BACKED implies such an entry: a page flagged without one (a failed backup
        // that a re-insert had marked resident) would never be backed up again.
        let write_back = sh.opts.write_policy == WritePolicy::WriteBack;
        let p = sh.page_size as u32;
        for page in 0..(pool.capacity() as u32 / p) {
            // Relaxed: quiescent.
            let backed = sh.pages[page as usize].flags.load(Ordering::Relaxed) & BACKED != 0;
            if pool.state(page * p) != Some(SlotState::Cached) {
                if backed {
                    return Err(format!("device page {page} is not cached but flagged BACKED"));
                }
                continue;
            }
            let (id, _) = sh.page_id(page);
            match host.get(&id) {
                Some(e) => {
                    let window = write_back && e.resident == NO_PAGE;
                    if !window && (e.resident != page || !backed) {
                        return Err(format!(
                            "device page {page} holds {id:?}, whose host copy names page {} (BACKED: {backed})",
                            e.resident
                        ));
                    }
                }
                None if backed => {
                    return Err(format!(
                        "device page {page} holds {id:?} and is flagged BACKED, but has no host copy"
                    ));
                }
                None => {}
            }
        }
        drop(host);
        // Device: the pool's Cached slots are exactly the tree's cached tokens, and its free
        // count is the Free slots (so free + cached + held == N, held being the rest).
        let st = self.dev.stats();
        let (mut free, mut cached) = (0u64, 0u64);
        for s in 0..pool.capacity() as u32 {
            match pool.state(s) {
                Some(SlotState::Free) => free += 1,
                Some(SlotState::Cached) => cached += 1,
                _ => {}
            }
        }
        if cached != st.tree.cached_tokens || free != st.free_slots {
            return Err(format!(
                "device pool: {cached} cached / {free} free slots, the tree caches {} and the pool counts {} free",
                st.tree.cached_tokens, st.free_slots
            ));
        }
        Ok(())
    }
}
