//! The device eviction hook of a cache with a tier (its protocols: the module docs of
//! [`super`], "The eviction hook without a lookup").

use super::*;

impl Shared {
    /// The eviction hook: device slots `runs` (whole pages) left the device tree and are
    /// not yet back in the pool. Each page's host copy becomes host-only; under
    /// `write_back` a page without one is copied to the host now (its slots cannot be
    /// reused before this returns).
    pub(super) fn device_evicted(&self, runs: &[crate::SlotRun]) {
        let p = self.page_size;
        let write_back = self.opts.write_policy == WritePolicy::WriteBack;
        let mut wb: Vec<(PageKey, Option<u64>, u32, u32)> = Vec::new();
        let mut removed = Removed::default();
        {
            let mut host = self.host();
            for r in runs {
                for s in r.slots().step_by(p) {
                    let page = s / p as u32;
                    let d = &self.pages[page as usize];
                    // Relaxed: statistics-grade state of a slot no one else owns now; BACKED
                    // and `entry` were written under the host lock, held here. Loads and
                    // stores, not swaps: no one else writes these words now (the page is
                    // unlinked and unpinned, so no insert counts it and no commit or load-back
                    // flags it; `Shared::abort` clears it under the host lock, held here), and
                    // a locked swap per page would serialize the misses of a long run.
                    let backed = d.flags.load(Ordering::Relaxed) & BACKED != 0;
                    if backed {
                        d.flags.store(0, Ordering::Relaxed);
                    }
                    if d.hits.load(Ordering::Relaxed) != 0 {
                        d.hits.store(0, Ordering::Relaxed);
                    }
                    // A page without BACKED has no entry naming it (see `DevPage::flags`):
                    // nothing to do unless `write_back` may copy it. With BACKED, the entry
                    // it recorded, if that id still holds this page's identity (it is then
                    // the entry a lookup by key finds: keys are unique among live entries).
                    if !backed && !write_back {
                        continue;
                    }
                    let (key, parent) = self.page_id(page);
                    let id = d.entry.load(Ordering::Relaxed);
                    let id =
                        if backed && host.live_with(id, &key) { Some(id) } else { host.find(&key) };
                    match id {
                        Some(id) => host.device_evicted(id, page),
                        None if write_back => {
                            if let Reserved::New(id) =
                                host.reserve(key, parent, NO_PAGE, 0, &mut removed)
                            {
                                wb.push((key, parent, page, id));
                            }
                        }
                        None => {}
                    }
                }
            }
        }
        self.removed(removed);
        if wb.is_empty() {
            return;
        }
        let dev: Vec<u32> =
            wb.iter().flat_map(|w| (0..p as u32).map(move |i| w.2 * p as u32 + i)).collect();
        // A host entry's id is its host page (its first slot `id * p`).
        let hst: Vec<u32> =
            wb.iter().flat_map(|w| (0..p as u32).map(move |i| w.3 * p as u32 + i)).collect();
        bump(&self.counters.copies_to_host, 1);
        // A copier that panics fails the write-back: its entries go (below) before the
        // panic goes on, so no host page stays reserved by an entry writing for ever. (The
        // tree's pass and the pool's guard return the evicted slots as it unwinds.)
        let (r, panic) =
            call_copier(|| self.copier.to_host(&dev, &hst).and_then(|t| self.copier.wait(t)));
        // `r` is consumed here, so no drop of the whole `Result` runs at the end of the
        // function (valgrind flags that drop's read of the niche-encoded `Ok(())`).
        let copied = match r {
            Ok(()) => true,
            Err(e) => {
                drop(e);
                false
            }
        };
        let mut host = self.host();
        match copied {
            true => {
                for w in &wb {
                    host.commit(w.3, NO_PAGE);
                }
                drop(host);
                bump(&self.counters.tokens_to_host, dev.len());
                bump(&self.counters.tokens_written_back, dev.len());
                if self.events.get().is_some()
                    && let Some(t) = &self.tokens
                {
                    for w in &wb {
                        let base = w.2 as usize * p;
                        // Relaxed: written by the insert that cached the page (see `set_page`).
                        let toks = (0..p).map(|i| t[base + i].load(Ordering::Relaxed)).collect();
                        self.stored(w.0.0, vec![w.0.1], w.1, toks);
                    }
                }
            }
            false => {
                for w in &wb {
                    self.abort(&mut host, w.3);
                }
                drop(host);
                bump(&self.counters.copy_failures, 1);
            }
        }
        resume(panic);
    }
}
