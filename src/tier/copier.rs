//! Copies between the device pool's KV memory and the host pool's ([`TierCopier`]).
//!
//! A copy is started with [`TierCopier::to_host`] or [`TierCopier::to_device`] and runs in
//! the background; the ticket it returns is polled ([`TierCopier::poll`]) or waited on
//! ([`TierCopier::wait`]). A copy that fails reports [`Error::Device`] from `poll`/`wait`
//! (or from the call that started it); its destinations then hold nothing meaningful and
//! the tier rolls back (see the tier's module docs).
//!
//! Backends:
//! - [`HostCopier`]: both sides in host memory ([`HostKvStorage`]), copied with memcpy when
//!   the copy starts (always built; what the tests and CPU-only engines use).
//! - [`NullCopier`]: no KV bytes at all, for an index-only replay; every copy is done at once.
//! - [`DeferredCopier`]: wraps another copier and holds each copy back until it has been
//!   polled a few times, optionally failing chosen copies: the in-flight windows and the
//!   failures the tier's tests drive.
//! - `CudaTierCopier` (feature `cuda`, `tier::cuda`): device memory ↔ pinned host memory
//!   on its own stream with one completion event per copy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::kv::HostKvStorage;

/// A copy in flight, named by the copier that started it.
pub type CopyTicket = u64;

/// Copies whole slots between the device pool's KV memory and the host pool's.
///
/// `Send + Sync`: every method may be called from any thread. Slot `i` of either side is
/// token slot `i` of that side's pool. Each call copies `src[i] -> dst[i]` for every `i`,
/// in every layer, K and V.
pub trait TierCopier: Send + Sync {
    /// Starts copying device slots `dev[i]` to host slots `host[i]`.
    fn to_host(&self, dev: &[u32], host: &[u32]) -> Result<CopyTicket>;
    /// Starts copying host slots `host[i]` to device slots `dev[i]`.
    fn to_device(&self, host: &[u32], dev: &[u32]) -> Result<CopyTicket>;
    /// `Ok(true)` once the copy is complete, `Ok(false)` while it runs, `Err` if it failed.
    /// After `Ok(true)` or `Err` the ticket is spent (polling it again is `InvalidArgument`).
    fn poll(&self, t: CopyTicket) -> Result<bool>;
    /// Blocks until the copy is complete; `Err` if it failed. Spends the ticket.
    fn wait(&self, t: CopyTicket) -> Result<()>;
}

/// Tickets of copies that completed at once, waiting to be polled (a ticket is reported
/// once).
#[derive(Debug, Default)]
struct Done {
    next: u64,
    done: HashMap<u64, Result<()>>,
}

impl Done {
    fn finish(&mut self, r: Result<()>) -> CopyTicket {
        self.next += 1;
        self.done.insert(self.next, r);
        self.next
    }

    fn take(&mut self, t: CopyTicket) -> Result<()> {
        match self.done.remove(&t) {
            Some(r) => r,
            None => Err(crate::error::invalid(format!("copy ticket {t} is unknown or spent"))),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is one map insert or remove: consistent after a panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Both sides in host memory: the "device" store and the host store are
/// [`HostKvStorage`]s with the same shape except their slot counts. Copies run in the
/// call that starts them (memcpy of runs of consecutive slots), so every ticket is done
/// when returned. Copies in opposite directions may run at once from any threads
/// ([`HostKvStorage::copy_to`] takes the two stores' locks in one global order).
#[derive(Debug)]
pub struct HostCopier {
    device: Arc<HostKvStorage>,
    host: Arc<HostKvStorage>,
    done: Mutex<Done>,
}

impl HostCopier {
    /// A copier between `device` and `host` (layouts equal but for `num_slots`:
    /// checked on each copy).
    pub fn new(device: Arc<HostKvStorage>, host: Arc<HostKvStorage>) -> HostCopier {
        HostCopier { device, host, done: Mutex::new(Done::default()) }
    }

    /// The device-side store.
    pub fn device(&self) -> &Arc<HostKvStorage> {
        &self.device
    }

    /// The host-side store.
    pub fn host(&self) -> &Arc<HostKvStorage> {
        &self.host
    }
}

impl TierCopier for HostCopier {
    fn to_host(&self, dev: &[u32], host: &[u32]) -> Result<CopyTicket> {
        self.device.copy_to(dev, &self.host, host)?;
        Ok(lock(&self.done).finish(Ok(())))
    }

    fn to_device(&self, host: &[u32], dev: &[u32]) -> Result<CopyTicket> {
        self.host.copy_to(host, &self.device, dev)?;
        Ok(lock(&self.done).finish(Ok(())))
    }

    fn poll(&self, t: CopyTicket) -> Result<bool> {
        lock(&self.done).take(t).map(|()| true)
    }

    fn wait(&self, t: CopyTicket) -> Result<()> {
        lock(&self.done).take(t)
    }
}

/// No KV bytes: the index alone (a replay that measures hit ratios and copy volumes).
/// Every copy is done at once.
#[derive(Debug, Default)]
pub struct NullCopier {
    done: Mutex<Done>,
}

impl TierCopier for NullCopier {
    fn to_host(&self, dev: &[u32], host: &[u32]) -> Result<CopyTicket> {
        check_lengths(dev, host)?;
        Ok(lock(&self.done).finish(Ok(())))
    }

    fn to_device(&self, host: &[u32], dev: &[u32]) -> Result<CopyTicket> {
        check_lengths(host, dev)?;
        Ok(lock(&self.done).finish(Ok(())))
    }

    fn poll(&self, t: CopyTicket) -> Result<bool> {
        lock(&self.done).take(t).map(|()| true)
    }

    fn wait(&self, t: CopyTicket) -> Result<()> {
        lock(&self.done).take(t)
    }
}

fn check_lengths(a: &[u32], b: &[u32]) -> Result<()> {
    if a.len() != b.len() {
        return Err(crate::error::invalid(format!(
            "copy: {} source slots but {} destinations",
            a.len(),
            b.len()
        )));
    }
    Ok(())
}

/// Which copies a [`DeferredCopier`] fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[doc(hidden)] // a test hook: checks, not an engine API (kept public for the tests)
pub enum FailPlan {
    /// None.
    #[default]
    Never,
    /// Every `n`-th copy started (from 1), counting both directions.
    Every(u64),
}

/// A copy held back by a [`DeferredCopier`].
#[derive(Debug)]
struct Held {
    to_host: bool,
    src: Vec<u32>,
    dst: Vec<u32>,
    polls_left: u32,
    fail: bool,
}

/// Wraps a copier, holding each copy back until it has been polled `delay` times (a wait
/// runs it at once) and failing the copies `fail` names: the copy only reaches the inner
/// copier when it completes, so until then its destination holds its old bytes, as a real
/// copy in flight may. A failed copy is never run. For tests of the in-flight windows and
/// the rollback.
#[derive(Debug)]
#[doc(hidden)] // a test hook: checks, not an engine API (kept public for the tests)
pub struct DeferredCopier<C: TierCopier> {
    inner: C,
    delay: u32,
    fail: FailPlan,
    state: Mutex<(u64, u64, HashMap<u64, Held>)>,
}

impl<C: TierCopier> DeferredCopier<C> {
    /// Holds copies for `delay` polls; fails those `fail` names.
    pub fn new(inner: C, delay: u32, fail: FailPlan) -> Self {
        DeferredCopier { inner, delay, fail, state: Mutex::new((0, 0, HashMap::new())) }
    }

    /// The wrapped copier.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    fn start(&self, to_host: bool, src: &[u32], dst: &[u32]) -> Result<CopyTicket> {
        check_lengths(src, dst)?;
        let mut s = lock(&self.state);
        s.0 += 1;
        s.1 += 1;
        let (t, n) = (s.0, s.1);
        let fail = matches!(self.fail, FailPlan::Every(k) if k > 0 && n % k == 0);
        let h =
            Held { to_host, src: src.to_vec(), dst: dst.to_vec(), polls_left: self.delay, fail };
        s.2.insert(t, h);
        Ok(t)
    }

    fn run(&self, h: Held) -> Result<()> {
        if h.fail {
            return Err(Error::Device("injected copy failure (DeferredCopier)".into()));
        }
        let t = if h.to_host {
            self.inner.to_host(&h.src, &h.dst)?
        } else {
            self.inner.to_device(&h.src, &h.dst)?
        };
        self.inner.wait(t)
    }
}

impl<C: TierCopier> TierCopier for DeferredCopier<C> {
    fn to_host(&self, dev: &[u32], host: &[u32]) -> Result<CopyTicket> {
        self.start(true, dev, host)
    }

    fn to_device(&self, host: &[u32], dev: &[u32]) -> Result<CopyTicket> {
        self.start(false, host, dev)
    }

    fn poll(&self, t: CopyTicket) -> Result<bool> {
        let h = {
            let mut s = lock(&self.state);
            let Some(h) = s.2.get_mut(&t) else {
                return Err(crate::error::invalid(format!("copy ticket {t} is unknown or spent")));
            };
            if h.polls_left > 0 {
                h.polls_left -= 1;
                return Ok(false);
            }
            s.2.remove(&t).expect("present")
        };
        self.run(h).map(|()| true)
    }

    fn wait(&self, t: CopyTicket) -> Result<()> {
        let h = lock(&self.state).2.remove(&t);
        match h {
            Some(h) => self.run(h),
            None => Err(crate::error::invalid(format!("copy ticket {t} is unknown or spent"))),
        }
    }
}

impl<T: TierCopier + ?Sized> TierCopier for Arc<T> {
    fn to_host(&self, dev: &[u32], host: &[u32]) -> Result<CopyTicket> {
        (**self).to_host(dev, host)
    }
    fn to_device(&self, host: &[u32], dev: &[u32]) -> Result<CopyTicket> {
        (**self).to_device(host, dev)
    }
    fn poll(&self, t: CopyTicket) -> Result<bool> {
        (**self).poll(t)
    }
    fn wait(&self, t: CopyTicket) -> Result<()> {
        (**self).wait(t)
    }
}
