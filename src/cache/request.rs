//! The engine-facing request cycle: what SGLang's scheduler does around its tree, as one
//! type.
//!
//! ```text
//! admit      match_and_lock the prompt; allocate slots for the uncached rest
//! extend     append generated (or next-chunk) tokens, allocating slots page by page
//! checkpoint insert_and_lock what the request has so far and swap the lock, so its prefix
//!            becomes visible to other requests (chunked prefill, long decodes)
//! finish     insert prompt + output, free duplicates and spare slots, release the lock
//! abort      give every held slot back and release the lock, caching nothing new
//! ```
//!
//! Slot ownership: `slots()[..locked_len()]` belong to the tree (cached and pinned by this
//! request's lock); the rest are held by the request until `finish`/`abort` (dropping an
//! unfinished request aborts it).
//!
//! A front that keeps requests between calls in a table of its own (the Python
//! extension's `Cache.admit`) holds each as a [`DetachedRequest`] ([`Request::detach`]) and
//! [`Cache::attach`]es it for each call: the same state, without the borrow.
//!
//! Eviction metadata, as SGLang's scheduler passes it: every insert of the request
//! (`checkpoint`, `finish`) carries the request's priority ([`Cache::admit_with_priority`];
//! 0 by default), and the length it inserted before as [`InsertOptions::inserted_len`]
//! (SGLang's `cache_inserted_len`), so a request counts one hit per node however often it
//! checkpoints.
//!
//! ```
//! use radixkv::{Cache, CacheOptions};
//!
//! let cache = Cache::new(CacheOptions { page_size: 16, pool_slots: 1 << 16, ..Default::default() })?;
//! let prompt: Vec<u32> = (0..100).collect();
//! let mut req = cache.admit(7, &prompt)?;   // match_and_lock + alloc for the uncached tail
//! let reuse = req.cached_len();             // tokens whose KV need not be computed
//! // ... prefill into req.slots()[reuse..] ...
//! req.checkpoint()?;                        // insert_and_lock so far: others can hit it now
//! req.extend(&[500, 501])?;                 // decode: slots for new tokens, page by page
//! req.finish()?;                            // insert prompt + output, free duplicates, unpin
//! assert_eq!(cache.admit(7, &prompt)?.cached_len(), 96); // 6 whole pages of 16
//! # let _ = reuse;
//! # Ok::<(), radixkv::Error>(())
//! ```

use super::Cache;
use crate::error::{Error, Result};
use crate::tree::{InsertOptions, PrefixLock};

/// One request's trip through a pooled cache (see the module docs). `Send`: a request may
/// be admitted on one scheduler thread and finished on another.
#[derive(Debug)]
pub struct Request<'c> {
    cache: &'c Cache,
    ns: u64,
    tokens: Vec<u32>,
    /// One slot per token, plus the spare slots of the last, partly used page.
    slots: Vec<u32>,
    cached_len: usize,
    lock: Option<PrefixLock>,
    /// The priority its inserts carry.
    priority: i32,
    /// The longest key it inserted so far (SGLang's `cache_inserted_len`).
    inserted_len: usize,
}

fn round_up(n: usize, p: usize) -> usize {
    n.div_ceil(p) * p
}

impl Cache {
    /// Admits a request: pins the longest cached prefix of `prompt` and allocates slots
    /// (whole pages, evicting when short) for the rest. On `OutOfSlots` nothing is held.
    /// `NoPool` without a pool.
    pub fn admit(&self, ns: u64, prompt: &[u32]) -> Result<Request<'_>> {
        self.admit_with_priority(ns, prompt, 0)
    }

    /// [`Cache::admit`] for a request whose inserts carry eviction priority `priority`
    /// (see [`InsertOptions::priority`]: read by the `priority` policy).
    pub fn admit_with_priority(
        &self,
        ns: u64,
        prompt: &[u32],
        priority: i32,
    ) -> Result<Request<'_>> {
        if !self.has_pool() {
            return Err(Error::NoPool);
        }
        let mut slots = Vec::with_capacity(round_up(prompt.len(), self.page_size()));
        let lock = self.tree().match_and_lock(ns, prompt, &mut slots).into_raw();
        let m = lock.len();
        let need = round_up(prompt.len() - m, self.page_size());
        if let Err(e) = self.alloc(need, &mut slots) {
            // Cannot fail: the lock is this cache's and released once.
            let _ = self.release(lock);
            return Err(e);
        }
        Ok(Request {
            cache: self,
            ns,
            tokens: prompt.to_vec(),
            slots,
            cached_len: m,
            lock: Some(lock),
            priority,
            inserted_len: 0,
        })
    }
}

/// A [`Request`] apart from its cache ([`Request::detach`]): the same state without the
/// borrow, for a front that keeps requests in a table of its own between calls (the Python
/// extension's `Cache.admit`). It holds what the request held, its slots and its pin, until
/// [`Cache::attach`] makes it a [`Request`] of the cache that admitted it again; dropped
/// unattached, those stay held (the slots out of the pool, the prefix pinned) for the
/// cache's lifetime. `Send`; a plain value otherwise.
#[derive(Debug)]
pub struct DetachedRequest {
    ns: u64,
    tokens: Vec<u32>,
    slots: Vec<u32>,
    cached_len: usize,
    lock: PrefixLock,
    priority: i32,
    inserted_len: usize,
}

impl DetachedRequest {
    /// Number of tokens so far.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when the request has no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

impl Cache {
    /// Makes a request detached from this cache ([`Request::detach`]) a [`Request`] again,
    /// as it was. A request of another cache is handed back unchanged (`Err`): its slots and
    /// pin are that cache's.
    // The refusal hands the request back whole (128 bytes, a lock in it): moving it is the
    // point, and it happens once per refused attach.
    #[allow(clippy::result_large_err)]
    pub fn attach(&self, d: DetachedRequest) -> std::result::Result<Request<'_>, DetachedRequest> {
        if d.lock.tree_id != self.tree().id() {
            return Err(d);
        }
        Ok(Request {
            cache: self,
            ns: d.ns,
            tokens: d.tokens,
            slots: d.slots,
            cached_len: d.cached_len,
            lock: Some(d.lock),
            priority: d.priority,
            inserted_len: d.inserted_len,
        })
    }
}

impl<'c> Request<'c> {
    /// The request apart from its cache, holding its slots and its pin (see
    /// [`DetachedRequest`]); [`Cache::attach`] gives it back.
    pub fn detach(mut self) -> DetachedRequest {
        let lock = self.lock.take().expect("an unfinished request holds its lock");
        DetachedRequest {
            ns: self.ns,
            tokens: std::mem::take(&mut self.tokens),
            // Taken: the drop below then has no slot to give back and no lock to release.
            slots: std::mem::take(&mut self.slots),
            cached_len: self.cached_len,
            lock,
            priority: self.priority,
            inserted_len: self.inserted_len,
        }
    }

    /// Namespace.
    pub fn namespace(&self) -> u64 {
        self.ns
    }

    /// Tokens so far (prompt, then whatever `extend` added).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Number of tokens so far.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when the request has no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// One slot per token: where each token's KV entry lives (or will be written).
    pub fn slots(&self) -> &[u32] {
        &self.slots[..self.tokens.len()]
    }

    /// Tokens found cached at admission (their KV need not be computed).
    pub fn cached_len(&self) -> usize {
        self.cached_len
    }

    /// The eviction priority its inserts carry.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// What its inserts pass as [`InsertOptions`] (once one succeeds, `inserted_len` grows
    /// to its key's length).
    fn insert_options(&self) -> InsertOptions {
        InsertOptions { priority: self.priority, inserted_len: self.inserted_len }
    }

    /// Tokens currently pinned in the tree for this request.
    pub fn locked_len(&self) -> usize {
        self.lock.as_ref().map_or(0, |l| l.len())
    }

    /// Appends tokens (generated ones, or the next prefill chunk), allocating slots for
    /// them page by page; may evict. On error nothing changes.
    pub fn extend(&mut self, tokens: &[u32]) -> Result<()> {
        let p = self.cache.page_size();
        let want = round_up(self.tokens.len() + tokens.len(), p);
        if want > self.slots.len() {
            let need = want - self.slots.len();
            self.cache.alloc(need, &mut self.slots)?;
        }
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Makes the request's page-aligned prefix visible to other requests:
    /// `insert_and_lock` it and swap the lock. Where another request cached the same
    /// tokens first, the request switches to the cached slots (its own are freed).
    /// Returns the tokens that were cached already.
    pub fn checkpoint(&mut self) -> Result<usize> {
        let n = self.cache.tree().aligned(self.tokens.len());
        let mut cached = Vec::new();
        let (existing, lock) = self.cache.insert_lock_cached(
            self.ns,
            &self.tokens[..n],
            &self.slots[..n],
            self.insert_options(),
            &mut cached,
        )?;
        self.inserted_len = self.inserted_len.max(n);
        self.slots[..existing].copy_from_slice(&cached[..existing]);
        let lock = lock.expect("a pinning insert returns a lock");
        if let Some(old) = self.lock.replace(lock) {
            // Cannot fail: the lock is this cache's and released once.
            let _ = self.cache.release(old);
        }
        Ok(existing)
    }

    /// Finishes: caches everything the request computed (its page-aligned tokens), frees
    /// the slots that duplicate cached ones and the spare slots, and releases the lock.
    /// Returns the tokens that were cached already.
    pub fn finish(mut self) -> Result<usize> {
        let len = self.tokens.len();
        let res = self.cache.insert_with(
            self.ns,
            &self.tokens,
            &self.slots[..len],
            self.insert_options(),
        );
        match res {
            Ok(existing) => {
                // The insert adopted or freed slots[..len]; the spare ones are still ours.
                let spare: Vec<u32> = self.slots.drain(len..).collect();
                self.slots.clear();
                self.tokens.clear();
                let r = self.cache.free(&spare);
                self.release_lock();
                r.map(|_| existing)
            }
            Err(e) => Err(e), // dropped: aborts
        }
    }

    /// Gives back every slot the request holds and releases its lock, caching nothing new.
    pub fn abort(self) {}

    fn release_lock(&mut self) {
        if let Some(l) = self.lock.take() {
            // Cannot fail: the lock is this cache's and released once.
            let _ = self.cache.release(l);
        }
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        let locked = self.locked_len();
        if self.slots.len() > locked {
            // Held slots: everything past what the tree caches for us. Cannot fail: the
            // request allocated them and nothing else frees them.
            let _ = self.cache.free(&self.slots[locked..]);
        }
        self.slots.clear();
        self.release_lock();
    }
}
