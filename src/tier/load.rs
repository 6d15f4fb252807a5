//! Load-back: host pages back into the device tree, of a [`Cache`] with a tier (its protocols: the module docs of [`super`]).

use super::*;

impl Tiered<'_> {
    pub(super) fn finish_load(&self, l: LoadOp, r: Result<()>) -> Result<Loaded> {
        let sh = &*self.shared;
        let p = sh.page_size;
        let loaded = l.tokens.len() - l.device_len;
        if let Err(e) = r {
            // Roll back: the slots go back to the pool, the host copies are unpinned.
            let _ = self.dev.free(&l.slots[l.device_len..]);
            sh.host().unpin(&l.entries, &[]);
            let _ = self.dev.release(l.lock);
            bump(&sh.counters.copy_failures, 1);
            return Err(e);
        }
        let mut cached = Vec::new();
        let ins = self.dev.insert_impl(
            l.ns,
            &l.tokens,
            &l.slots,
            true,
            InsertOptions::default(),
            Some(&mut cached),
        );
        let (existing, lock) = match ins {
            Ok((e, lk)) => (e, lk.expect("a pinning insert returns a lock")),
            Err(e) => {
                let _ = self.dev.free(&l.slots[l.device_len..]);
                sh.host().unpin(&l.entries, &[]);
                let _ = self.dev.release(l.lock);
                return Err(e);
            }
        };
        let mut slots = l.slots;
        slots[..existing].copy_from_slice(&cached[..existing]);
        let resident: Vec<u32> =
            (0..loaded / p).map(|i| slots[l.device_len + i * p] / p as u32).collect();
        {
            let mut host = sh.host();
            host.unpin(&l.entries, &resident);
            for (&d, &id) in resident.iter().zip(&l.entries) {
                sh.set_backed(&host, d, id); // pinned by `lock`
            }
        }
        let _ = self.dev.release(l.lock);
        bump(&sh.counters.tokens_to_device, loaded);
        bump(&sh.counters.load_backs, 1);
        Ok(Loaded { lock, slots, device_len: l.device_len, loaded, outcome: LoadOutcome::Loaded })
    }

    /// Starts loading back the host pages that extend the device match of `tokens`, at
    /// most `max_tokens` of them: allocates device slots (evicting as [`Cache::alloc`]),
    /// pins the host copies and starts the copy. Take the result with
    /// [`Cache::wait_load`] or [`Cache::try_load`]: a [`Loaded`] holding a
    /// lock over the device prefix with the loaded pages (when nothing is worth loading,
    /// over the device prefix alone, [`LoadOutcome`] saying why). `OutOfSlots` (nothing
    /// changed) when the device cannot hold the pages; a failed copy is `Device` from
    /// `wait_load`, with everything rolled back.
    pub(crate) fn load_back(
        &self,
        ns: u64,
        tokens: &[u32],
        max_tokens: usize,
    ) -> Result<LoadTicket> {
        self.poll();
        let sh = &*self.shared;
        let p = sh.page_size;
        let id = self.next_load.fetch_add(1, Ordering::Relaxed);
        let mut prefix = Vec::new();
        let lock0 = self.dev.tree().match_and_lock(ns, tokens, &mut prefix).into_raw();
        let d = lock0.len();
        bump(&sh.counters.device_hit_tokens, d);
        let n_pages = tokens.len() / p;
        let skip = |lock0, prefix, outcome| {
            bump(&sh.counters.load_backs_skipped, 1);
            let loaded = Loaded { lock: lock0, slots: prefix, device_len: d, loaded: 0, outcome };
            lock(&self.results).insert(id, Ok(loaded));
            Ok(LoadTicket(id))
        };
        if n_pages <= d / p || max_tokens < p {
            return skip(lock0, prefix, LoadOutcome::NothingOnHost);
        }
        let hashes = sh.hashes(ns, tokens);
        let want = &hashes[d / p..];
        let max_pages = max_tokens / p;
        let pinned = {
            let mut host = sh.host();
            let found = host.find_run(ns, want, max_pages);
            if found.is_empty() {
                drop(host);
                return skip(lock0, prefix, LoadOutcome::NothingOnHost);
            }
            if found.len() * p < sh.opts.load_back_min {
                drop(host);
                return skip(lock0, prefix, LoadOutcome::TooShort);
            }
            host.touch_run(&found, true);
            found
        };
        let m = pinned.len();
        bump(&sh.counters.host_hit_tokens, m * p);
        let mut new = Vec::new();
        if let Err(e) = self.dev.alloc(m * p, &mut new) {
            sh.host().unpin(&pinned, &[]);
            let _ = self.dev.release(lock0);
            return Err(e);
        }
        for i in 0..m {
            let k = d / p + i;
            let parent = k.checked_sub(1).map(|j| hashes[j]);
            sh.set_page(new[i * p] / p as u32, ns, hashes[k], parent, page_tokens(tokens, k, p));
        }
        let mut hst: Vec<u32> = Vec::with_capacity(m * p);
        for &id in &pinned {
            hst.extend(id * p as u32..(id + 1) * p as u32);
        }
        bump(&sh.counters.copies_to_device, 1);
        let mut slots = prefix;
        slots.extend_from_slice(&new);
        let op = LoadOp {
            id,
            ticket: 0,
            ns,
            tokens: tokens[..d + m * p].to_vec(),
            slots,
            device_len: d,
            lock: lock0,
            entries: pinned,
        };
        // If the copier panics, the load-back is finished as failed (`finish`: the slots
        // freed, the host copies unpinned, the prefix released) under an id no caller holds.
        let (op, started) = self.ask(Op::Load(Box::new(op)), |_| sh.copier.to_device(&hst, &new));
        let Op::Load(mut l) = op else { unreachable!("a load-back") };
        match started {
            Ok(t) => l.ticket = t,
            // Rolled back as a failed copy; nothing is stored under `id`.
            Err(e) => return self.finish_load(*l, Err(e)).map(|_| LoadTicket(id)),
        }
        self.settle_or_queue(Op::Load(l));
        Ok(LoadTicket(id))
    }

    /// The result of a load-back if it is done (taking it), `None` while its copy runs.
    pub(crate) fn try_load(&self, t: LoadTicket) -> Option<Result<Loaded>> {
        self.poll();
        lock(&self.results).remove(&t.0)
    }

    /// Waits for a load-back and takes its result. `InvalidArgument` for a ticket that is
    /// unknown or already taken. If the copier panics, the load-back is rolled back (its
    /// result, taken next, is `Device`) and the panic goes on.
    pub(crate) fn wait_load(&self, t: LoadTicket) -> Result<Loaded> {
        loop {
            if let Some(r) = lock(&self.results).remove(&t.0) {
                return r;
            }
            let (taken, finishing) = {
                let mut pend = self.pending();
                let i = pend.iter().position(|o| matches!(o, Op::Load(l) if l.id == t.0));
                match i {
                    Some(i) => (Some(self.taken(vec![pend.swap_remove(i)])), 0),
                    None => (None, self.finishing.load(Ordering::SeqCst)),
                }
            };
            match taken {
                Some(mut taken) => {
                    taken.finish_next(|op| self.shared.copier.wait(op_ticket(op)).map(|()| true));
                    drop(taken); // its result is stored: `finishing` comes down
                }
                // Another thread took it and is finishing it: its result comes.
                None if finishing > 0 => crate::sync::yield_now(),
                None => {
                    return lock(&self.results).remove(&t.0).unwrap_or_else(|| {
                        Err(invalid(format!("load-back ticket {} is unknown or taken", t.0)))
                    });
                }
            }
        }
    }
}
