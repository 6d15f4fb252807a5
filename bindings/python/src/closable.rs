//! [`Closable`]: a native object's Rust value that `close()` can take away while other
//! threads call into it (what `NativeCache` and `NativeRouterIndex` share).
//!
//! A call checks `closing`, then runs under the read lock with the GIL released; `close`
//! sets `closing` (new calls are refused at once), takes the write lock (waiting for the
//! calls in flight) and takes the value out.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;

use crate::errors::*;

/// The error of a call on a closed object (`CacheClosedError`), named `what`.
fn closed(what: &str) -> Fail {
    fail(CLOSED, format!("the {what} is closed"))
}

/// A value `close()` can take away; see the module docs.
pub(crate) struct Closable<T> {
    /// What the object is called in the closed error ("cache", "router index").
    what: &'static str,
    closing: AtomicBool,
    state: RwLock<Option<T>>,
}

impl<T: Send + Sync> Closable<T> {
    /// Holds `value`.
    pub(crate) fn new(value: T) -> Self {
        Closable::named(value, "cache")
    }

    /// Holds `value`, called `what` in the closed error.
    pub(crate) fn named(value: T, what: &'static str) -> Self {
        Closable { what, closing: AtomicBool::new(false), state: RwLock::new(Some(value)) }
    }

    /// Runs `f` on the value with the GIL released; `function` names the operation in an
    /// error's message. A closed (or closing) object is refused.
    pub(crate) fn with<R: Send>(
        &self,
        py: Python<'_>,
        function: &str,
        f: impl FnOnce(&T) -> Res<R> + Send,
    ) -> PyResult<R> {
        self.refuse_if_closing(py, function)?;
        let r = py.detach(|| {
            let g = self.state.read().unwrap_or_else(|p| p.into_inner());
            match g.as_ref() {
                Some(c) => f(c),
                None => Err(closed(self.what)),
            }
        });
        done(py, function, r)
    }

    /// As [`Closable::with`], but with the GIL held throughout: for a call that reads a
    /// caller's buffer in place (no copy), so that no Python thread can write it meanwhile.
    /// It cannot deadlock on the GIL: a call that holds the read lock without the GIL never
    /// needs the GIL to finish, and `close` waits for the write lock with the GIL released.
    pub(crate) fn with_held<R>(
        &self,
        py: Python<'_>,
        function: &str,
        f: impl FnOnce(&T) -> Res<R>,
    ) -> PyResult<R> {
        self.refuse_if_closing(py, function)?;
        let r = {
            let g = self.state.read().unwrap_or_else(|p| p.into_inner());
            match g.as_ref() {
                Some(c) => f(c),
                None => Err(closed(self.what)),
            }
        };
        done(py, function, r)
    }

    /// Runs `f` on the value alone (`&mut`: under the write lock, so it waits for the
    /// calls in flight and calls that start meanwhile wait for it), with the GIL released.
    /// For the cache's exclusive operations (`Cache::clear`). A closed (or closing) object is
    /// refused.
    pub(crate) fn with_mut<R: Send>(
        &self,
        py: Python<'_>,
        function: &str,
        f: impl FnOnce(&mut T) -> Res<R> + Send,
    ) -> PyResult<R> {
        self.refuse_if_closing(py, function)?;
        let r = py.detach(|| {
            let mut g = self.state.write().unwrap_or_else(|p| p.into_inner());
            match g.as_mut() {
                Some(c) => f(c),
                None => Err(closed(self.what)),
            }
        });
        done(py, function, r)
    }

    /// `Err` (the closed error, naming `function`) once `close` has begun.
    pub(crate) fn refuse_if_closing(&self, py: Python<'_>, function: &str) -> PyResult<()> {
        if self.closing() {
            return Err(to_pyerr(py, function, closed(self.what)));
        }
        Ok(())
    }

    /// Refuses new calls, waits for those in flight, and hands the value (once) to
    /// `finish` with the GIL released. Idempotent.
    pub(crate) fn close(&self, py: Python<'_>, finish: impl FnOnce(T) + Send) {
        self.closing.store(true, Ordering::Release);
        py.detach(|| {
            let mut g = self.state.write().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = g.take() {
                finish(c);
            }
        });
    }

    /// Whether the value is gone.
    pub(crate) fn closed(&self) -> bool {
        self.state.read().map(|g| g.is_none()).unwrap_or(true)
    }

    /// Whether calls are refused (closing or closed).
    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}
