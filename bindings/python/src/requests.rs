//! The request cycle for Python (`Cache.admit` → `radixkv.Request`): the core's
//! [`radixkv::Request`] (admit, extend, checkpoint, finish, abort), kept between calls as a
//! [`DetachedRequest`] in its cache's [`RequestTable`] under a handle, and attached for the
//! length of each call. `NativeRequests` holds a strong reference to its `NativeCache` and
//! goes through its door (`Closable::with`: the GIL released, refused once `close()`
//! began); closing the cache aborts the requests still in the table (their slots back in
//! the pool, their pins released).
//!
//! A call takes its request out of the table for its length, so two threads calling one
//! request at once are one call and one refusal, never a race on its state.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use radixkv::{Cache, DetachedRequest, Request};

use crate::cache::{NativeCache, oor, slot_buffer, tokens_of};
use crate::errors::*;

/// The live requests of one cache, by handle.
#[derive(Default)]
pub(crate) struct RequestTable {
    map: Mutex<HashMap<u64, DetachedRequest>>,
    next: AtomicU64,
}

impl RequestTable {
    fn lk(&self) -> std::sync::MutexGuard<'_, HashMap<u64, DetachedRequest>> {
        // Every critical section is one map operation: consistent after a panic.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, d: DetachedRequest) -> u64 {
        let h = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.lk().insert(h, d);
        h
    }

    fn take(&self, h: u64) -> Res<DetachedRequest> {
        self.lk().remove(&h).ok_or_else(|| {
            fail(
                INVALID_ARGUMENT,
                format!(
                    "request {h} is finished or aborted (or another thread is calling it right \
                     now)"
                ),
            )
        })
    }

    /// Aborts every request still in the table (the cache is closing).
    pub(crate) fn abort_all(&self, c: &Cache) {
        let all: Vec<DetachedRequest> = self.lk().drain().map(|(_, d)| d).collect();
        for d in all {
            if let Ok(r) = c.attach(d) {
                r.abort();
            }
        }
    }
}

/// What Python sees of a request after a call: `(len, cached_len, locked_len, slots)`.
type State<'py> = (usize, usize, usize, Bound<'py, PyAny>);

/// [`State`] before the GIL is taken back: the slots as a vector.
type RawState = (usize, usize, usize, Vec<u32>);

/// The request calls of one `NativeCache` (see the module docs).
#[pyclass(frozen, module = "radixkv._radixkv")]
pub struct NativeRequests {
    cache: Py<NativeCache>,
}

impl NativeRequests {
    fn c(&self) -> &NativeCache {
        self.cache.get()
    }

    /// Runs `f` on request `h` attached to the cache, with the GIL released, and puts it
    /// back in the table when `f` leaves it (`Some`); `function` names the Python method.
    fn on<T: Send>(
        &self,
        py: Python<'_>,
        function: &str,
        h: u64,
        f: impl FnOnce(&mut Request<'_>) -> Res<T> + Send,
    ) -> PyResult<(T, RawState)> {
        let table = &self.c().requests;
        self.c().inner.with(py, function, |c| {
            let d = table.take(h)?;
            let mut r =
                c.attach(d).map_err(|_| fail(INTERNAL_ERROR, "a request of another cache"))?;
            // On an error the request is as it was (the core's calls change nothing then).
            let out = f(&mut r);
            let state = (r.len(), r.cached_len(), r.locked_len(), r.slots().to_vec());
            table.lk().insert(h, r.detach());
            out.map(|v| (v, state))
        })
    }
}

fn state<'py>(py: Python<'py>, s: RawState) -> PyResult<State<'py>> {
    Ok((s.0, s.1, s.2, slot_buffer(py, &s.3)?))
}

#[pymethods]
impl NativeRequests {
    /// The request calls of `cache`.
    #[new]
    fn new(cache: Py<NativeCache>) -> Self {
        NativeRequests { cache }
    }

    /// Admits `tokens` in `ns` with eviction priority `priority`: `(handle, state)`.
    fn admit<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
        priority: i64,
    ) -> PyResult<(u64, State<'py>)> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let table = &self.c().requests;
        let (h, s) = self.c().inner.with(py, "Cache.admit", |c| {
            let priority = radixkv::checked_priority(priority).map_err(st)?;
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let r = c.admit_with_priority(ns, toks, priority).map_err(|e| match e {
                radixkv::Error::NoPool => no_pool(),
                e => st(e),
            })?;
            let s = (r.len(), r.cached_len(), r.locked_len(), r.slots().to_vec());
            Ok((table.insert(r.detach()), s))
        })?;
        drop(t);
        Ok((h, state(py, s)?))
    }

    /// Appends `tokens` to request `h`, allocating slots page by page: its state.
    fn extend<'py>(
        &self,
        py: Python<'py>,
        h: u64,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<State<'py>> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let ((), s) = self.on(py, "Request.extend", h, |r| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            r.extend(toks).map_err(st)
        })?;
        drop(t);
        state(py, s)
    }

    /// Checkpoints request `h`: `(tokens cached already, state)`.
    fn checkpoint<'py>(&self, py: Python<'py>, h: u64) -> PyResult<(usize, State<'py>)> {
        let (e, s) = self.on(py, "Request.checkpoint", h, |r| r.checkpoint().map_err(st))?;
        Ok((e, state(py, s)?))
    }

    /// Finishes request `h` (it leaves the table, also when the insert fails: the core's
    /// `finish` aborts then): the tokens cached already.
    fn finish(&self, py: Python<'_>, h: u64) -> PyResult<usize> {
        let table = &self.c().requests;
        self.c().inner.with(py, "Request.finish", |c| {
            let r = c
                .attach(table.take(h)?)
                .map_err(|_| fail(INTERNAL_ERROR, "a request of another cache"))?;
            r.finish().map_err(st)
        })
    }

    /// Aborts request `h`: its slots go back, its pin is released, nothing new is cached.
    fn abort(&self, py: Python<'_>, h: u64) -> PyResult<()> {
        let table = &self.c().requests;
        self.c().inner.with(py, "Request.abort", |c| {
            let r = c
                .attach(table.take(h)?)
                .map_err(|_| fail(INTERNAL_ERROR, "a request of another cache"))?;
            r.abort();
            Ok(())
        })
    }
}
