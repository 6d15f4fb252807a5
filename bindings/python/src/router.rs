//! `radixkv._radixkv.NativeRouterIndex`: a `radixkv_router::RouterIndex` (the router
//! index of `ROUTER.md`) for Python; `radixkv.RouterIndex` (`radixkv/_router.py`) is its
//! public face.
//!
//! As for the cache (`cache.rs`): arguments are converted first with the GIL held (token
//! and hash buffers are copied by `input.rs`, payloads other than `bytes` too), every call
//! into the index runs with the GIL released (`Python::detach`, through [`Closable`]), and
//! Python results are built after. The index's structured errors become the classes
//! `radixkv._router` registers ([`register_router_errors`]), built with the error's fields
//! as keyword arguments (`expected`, `got`, `worker`, ...), never parsed from its text.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use radixkv_router::{
    DumpBlock, DumpGroup, GapPolicy, Medium, Refusal, RouterError, RouterIndex, RouterOptions,
    Score, Worker, WorkerDump,
};

use crate::cache::oor;
use crate::closable::Closable;
use crate::errors::*;
use crate::input::{Input, Input64, OutOfRange, buffer_bytes, to_input, to_input64};

/// `RKV_SEQUENCE_GAP`, from the core's status table.
pub const SEQUENCE_GAP: i32 = radixkv::error::status::SEQUENCE_GAP;

/// The router's error classes by variant name, registered by `radixkv._router` at import.
static CLASSES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();

/// Registers the router's error classes: a dict from the names `SequenceGap`, `Malformed`,
/// `UnknownParent`, `UnknownRemovals`, `Unaligned`, `Empty`, `TooManyWorkers`,
/// `InvalidOptions` and `BadDump` to classes called as `cls(message, status, **fields)`.
#[pyfunction]
pub fn _register_router_errors(py: Python<'_>, classes: Bound<'_, PyDict>) -> PyResult<()> {
    CLASSES
        .set(py, classes.unbind())
        .map_err(|_| PyRuntimeError::new_err("the router error classes are registered already"))
}

/// A worker as the Python tuple `(worker_id, dp_rank)`.
fn worker_tuple<'py>(py: Python<'py>, w: Worker) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, [w.worker_id, u64::from(w.dp_rank)])
}

/// The Python exception of a router error raised by `function` (its C name).
fn router_err(py: Python<'_>, function: &str, e: RouterError) -> PyErr {
    let msg = format!("{function}: {e}");
    set_last(&msg);
    let build = || -> PyResult<PyErr> {
        let kw = PyDict::new(py);
        let status = e.status();
        let name = match &e {
            RouterError::InvalidOptions { block_size, max_workers } => {
                kw.set_item("block_size", block_size)?;
                kw.set_item("max_workers", max_workers)?;
                "InvalidOptions"
            }
            RouterError::Malformed { reason } => {
                kw.set_item("reason", reason)?;
                "Malformed"
            }
            RouterError::SequenceGap { worker, expected, got } => {
                kw.set_item("worker", worker_tuple(py, *worker)?)?;
                kw.set_item("expected", expected)?;
                kw.set_item("got", got)?;
                "SequenceGap"
            }
            RouterError::UnknownParent { parent } => {
                kw.set_item("parent", parent)?;
                "UnknownParent"
            }
            RouterError::UnknownRemovals { count } => {
                kw.set_item("count", count)?;
                "UnknownRemovals"
            }
            RouterError::Unaligned { blocks, tokens, block_size, expected } => {
                kw.set_item("blocks", blocks)?;
                kw.set_item("tokens", tokens)?;
                kw.set_item("block_size", block_size)?;
                kw.set_item("expected", expected)?;
                "Unaligned"
            }
            RouterError::Empty => "Empty",
            RouterError::TooManyWorkers { max_workers } => {
                kw.set_item("max_workers", max_workers)?;
                "TooManyWorkers"
            }
            RouterError::BadDump { worker } => {
                kw.set_item("worker", worker_tuple(py, *worker)?)?;
                "BadDump"
            }
        };
        let Some(classes) = CLASSES.get(py) else {
            return Ok(PyRuntimeError::new_err(msg.clone()));
        };
        let Some(cls) = classes.bind(py).get_item(name)? else {
            return Ok(PyRuntimeError::new_err(msg.clone()));
        };
        Ok(PyErr::from_value(cls.call((msg.clone(), status), Some(&kw))?))
    };
    build().unwrap_or_else(|e| e)
}

/// A medium's number as the Python layer passes it: 0 GPU, 1 CPU_PINNED.
fn medium_of(m: u32) -> PyResult<Medium> {
    match m {
        0 => Ok(Medium::Gpu),
        1 => Ok(Medium::CpuPinned),
        _ => {
            Err(PyValueError::new_err(format!("medium must be 0 (GPU) or 1 (CPU_PINNED), not {m}")))
        }
    }
}

fn options(block_size: u32, max_workers: u32, gap_policy: u32) -> PyResult<RouterOptions> {
    let gap_policy = match gap_policy {
        0 => GapPolicy::Clear,
        1 => GapPolicy::Refuse,
        g => {
            return Err(PyValueError::new_err(format!(
                "gap_policy must be 0 (clear) or 1 (refuse), not {g}"
            )));
        }
    };
    Ok(RouterOptions { block_size, max_workers, gap_policy })
}

/// A 64-bit argument's out-of-range value, named.
fn oor64(e: OutOfRange) -> Fail {
    fail(
        VALUE,
        format!(
            "{}[{}] = {} is out of range: 64-bit hashes must be in [-2**63, 2**64)",
            e.what, e.index, e.value
        ),
    )
}

/// The snake-case name of a refusal reason (the keys of `stats()["refused_by"]`).
fn refusal_name(r: Refusal) -> &'static str {
    match r {
        Refusal::Malformed => "malformed",
        Refusal::UnknownParent => "unknown_parent",
        Refusal::UnknownRemoval => "unknown_removal",
        Refusal::Unaligned => "unaligned",
        Refusal::Empty => "empty",
        Refusal::TooManyWorkers => "too_many_workers",
        Refusal::SequenceGap => "sequence_gap",
    }
}

/// Scores as `(worker_id, dp_rank, device_blocks, any_blocks)` tuples, sorted by worker.
fn scores_list<'py>(py: Python<'py>, scores: &[Score]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(
        py,
        scores
            .iter()
            .map(|s| (s.worker.worker_id, s.worker.dp_rank, s.device_blocks, s.any_blocks)),
    )
}

/// A router call's own result (its error becomes a registered class, see [`router_err`]).
type Got<T> = Result<T, RouterError>;

/// `(workers, blocks, memberships, bytes, events, batches, gaps, restarts, other_groups,
/// refused_by)`.
type Stats10 = (u64, u64, u64, u64, u64, u64, u64, u64, u64, Vec<(&'static str, u64)>);

/// A router index (see the module docs).
#[pyclass(frozen, module = "radixkv._radixkv")]
pub struct NativeRouterIndex {
    inner: Closable<RouterIndex>,
    /// Tokens per block.
    #[pyo3(get)]
    block_size: u32,
    /// Live workers at most.
    #[pyo3(get)]
    max_workers: u32,
    /// 0 clear, 1 refuse.
    #[pyo3(get)]
    gap_policy: u32,
}

impl NativeRouterIndex {
    fn wrap(idx: RouterIndex) -> NativeRouterIndex {
        let o = idx.options();
        NativeRouterIndex {
            block_size: o.block_size,
            max_workers: o.max_workers,
            gap_policy: match o.gap_policy {
                GapPolicy::Clear => 0,
                GapPolicy::Refuse => 1,
            },
            inner: Closable::named(idx, "router index"),
        }
    }

    /// Runs `f` on the index with the GIL released; its `RouterError` becomes the registered
    /// class, an input's [`Fail`] the package's usual error. `function` is the C name.
    fn call<R: Send>(
        &self,
        py: Python<'_>,
        function: &str,
        f: impl FnOnce(&RouterIndex) -> Res<Got<R>> + Send,
    ) -> PyResult<R> {
        match self.inner.with(py, function, f)? {
            Ok(v) => Ok(v),
            Err(e) => Err(router_err(py, function, e)),
        }
    }
}

/// The payload of `apply_batch`: `bytes` are read where they are (immutable), any other
/// bytes-like object is copied while the GIL is held.
enum Payload<'py> {
    Bytes(Bound<'py, PyBytes>),
    Copy(Vec<u8>),
}

fn payload_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Payload<'py>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Payload::Bytes(b.clone()));
    }
    match buffer_bytes(obj, "payload")? {
        Some(v) => Ok(Payload::Copy(v)),
        None => {
            let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            Err(PyTypeError::new_err(format!(
                "payload: expected a bytes-like object (bytes, bytearray, memoryview), got {ty}"
            )))
        }
    }
}

/// One worker record of a dump given to `restore`: a dict with `worker_id`, `dp_rank`,
/// `next_seq` (int or None), `blocks` (`(engine_hash, chain_key, media)` triples) and,
/// optionally, `groups` (`(group_idx, main_attention)` pairs; missing: none learned).
fn worker_dump(i: usize, rec: &Bound<'_, PyAny>) -> PyResult<WorkerDump> {
    let bad = |what: &str| PyValueError::new_err(format!("dump[{i}]: {what}"));
    let d = rec.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "dump[{i}]: expected a dict with worker_id, dp_rank, next_seq and blocks"
        ))
    })?;
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(k)?.ok_or_else(|| bad(&format!("missing {k:?}")))
    };
    let worker_id: u64 =
        get("worker_id")?.extract().map_err(|_| bad("worker_id must be an int in [0, 2**64)"))?;
    let dp_rank: u32 =
        get("dp_rank")?.extract().map_err(|_| bad("dp_rank must be an int in [0, 2**32)"))?;
    let next_seq: Option<u64> =
        get("next_seq")?.extract().map_err(|_| bad("next_seq must be None or an int"))?;
    let mut blocks = Vec::new();
    for (j, b) in get("blocks")?.try_iter()?.enumerate() {
        let (engine_hash, chain_key, media): (u64, u64, u8) = b?.extract().map_err(|_| {
            bad(&format!("blocks[{j}] must be an (engine_hash, chain_key, media) triple of ints"))
        })?;
        blocks.push(DumpBlock { engine_hash, chain_key, media });
    }
    let mut groups = Vec::new();
    if let Some(gs) = d.get_item("groups")? {
        for (j, g) in gs.try_iter()?.enumerate() {
            let (group_idx, main_attention): (u32, bool) = g?.extract().map_err(|_| {
                bad(&format!("groups[{j}] must be a (group_idx, main_attention) pair"))
            })?;
            groups.push(DumpGroup { group_idx, main_attention });
        }
    }
    Ok(WorkerDump { worker: Worker::new(worker_id, dp_rank), next_seq, blocks, groups })
}

#[pymethods]
impl NativeRouterIndex {
    /// `gap_policy`: 0 clear, 1 refuse.
    #[new]
    fn new(py: Python<'_>, block_size: u32, max_workers: u32, gap_policy: u32) -> PyResult<Self> {
        let opts = options(block_size, max_workers, gap_policy)?;
        // The slots array is allocated up front: large `max_workers` take a while.
        let r = py.detach(|| RouterIndex::new(opts));
        r.map(NativeRouterIndex::wrap).map_err(|e| router_err(py, "RouterIndex", e))
    }

    /// An index holding exactly what `dump` (a list of worker dicts, as `dump()` returns)
    /// records.
    #[staticmethod]
    fn restore(
        py: Python<'_>,
        dump: &Bound<'_, PyAny>,
        block_size: u32,
        max_workers: u32,
        gap_policy: u32,
    ) -> PyResult<Self> {
        let opts = options(block_size, max_workers, gap_policy)?;
        let mut recs = Vec::new();
        for (i, rec) in dump.try_iter()?.enumerate() {
            recs.push(worker_dump(i, &rec?)?);
        }
        let r = py.detach(|| RouterIndex::restore(opts, &recs));
        r.map(NativeRouterIndex::wrap).map_err(|e| router_err(py, "RouterIndex.restore", e))
    }

    /// Refuses new calls, waits for those in flight and frees the index. Idempotent.
    fn close(&self, py: Python<'_>) {
        self.inner.close(py, drop);
    }

    /// Whether the index is freed.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.closed()
    }

    /// `(events, refused, cleared_first)` of one vLLM KV-event batch (msgpack `payload`)
    /// numbered `seq` from worker `worker_id`.
    fn apply_batch(
        &self,
        py: Python<'_>,
        worker_id: u64,
        seq: u64,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<(usize, usize, bool)> {
        let p = payload_of(payload)?;
        let bytes: &[u8] = match &p {
            Payload::Bytes(b) => b.as_bytes(),
            Payload::Copy(v) => v,
        };
        self.call(py, "RouterIndex.apply_batch", |r| {
            Ok(r.apply_batch(worker_id, seq, bytes).map(|b| (b.events, b.refused, b.cleared_first)))
        })
    }

    /// `BlockStored` with tokens (`block_size` per block). `medium`: 0 GPU, 1 CPU_PINNED.
    #[pyo3(signature = (worker_id, dp_rank, block_hashes, token_ids, parent, lora_name, cache_salt, medium))]
    #[allow(clippy::too_many_arguments)]
    fn stored(
        &self,
        py: Python<'_>,
        worker_id: u64,
        dp_rank: u32,
        block_hashes: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
        parent: Option<u64>,
        lora_name: Option<String>,
        cache_salt: Option<String>,
        medium: u32,
    ) -> PyResult<()> {
        let m = medium_of(medium)?;
        let h: Input64 = to_input64(block_hashes, "block_hashes")?;
        let t: Input = to_input(token_ids, "token_ids")?;
        let (hv, tv) = (h.view(), t.view());
        let w = Worker::new(worker_id, dp_rank);
        self.call(py, "RouterIndex.stored", |r| {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let hashes = hv.get("block_hashes", &mut a).map_err(oor64)?;
            let toks = tv.get("token_ids", &mut b).map_err(oor)?;
            Ok(r.stored(w, lora_name.as_deref(), cache_salt.as_deref(), parent, hashes, toks, m))
        })
    }

    /// `BlockStored` with the blocks' content hashes (as `content_hashes` computes them,
    /// namespace mixed in) instead of tokens.
    #[allow(clippy::too_many_arguments)]
    fn stored_hashes(
        &self,
        py: Python<'_>,
        worker_id: u64,
        dp_rank: u32,
        block_hashes: &Bound<'_, PyAny>,
        content_hashes: &Bound<'_, PyAny>,
        parent: Option<u64>,
        medium: u32,
    ) -> PyResult<()> {
        let m = medium_of(medium)?;
        let h = to_input64(block_hashes, "block_hashes")?;
        let c = to_input64(content_hashes, "content_hashes")?;
        let (hv, cv) = (h.view(), c.view());
        let w = Worker::new(worker_id, dp_rank);
        self.call(py, "RouterIndex.stored_hashes", |r| {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let hashes = hv.get("block_hashes", &mut a).map_err(oor64)?;
            let contents = cv.get("content_hashes", &mut b).map_err(oor64)?;
            Ok(r.stored_hashes(w, parent, hashes, contents, m))
        })
    }

    /// `BlockRemoved`: the worker dropped its `medium` copy of `block_hashes`.
    fn removed(
        &self,
        py: Python<'_>,
        worker_id: u64,
        dp_rank: u32,
        block_hashes: &Bound<'_, PyAny>,
        medium: u32,
    ) -> PyResult<()> {
        let m = medium_of(medium)?;
        let h = to_input64(block_hashes, "block_hashes")?;
        let hv = h.view();
        let w = Worker::new(worker_id, dp_rank);
        self.call(py, "RouterIndex.removed", |r| {
            let mut a = Vec::new();
            let hashes = hv.get("block_hashes", &mut a).map_err(oor64)?;
            Ok(r.removed(w, hashes, m))
        })
    }

    /// `AllBlocksCleared`: the worker holds nothing any more (its cursor is kept).
    fn cleared(&self, py: Python<'_>, worker_id: u64, dp_rank: u32) -> PyResult<()> {
        let w = Worker::new(worker_id, dp_rank);
        self.call(py, "RouterIndex.cleared", |r| {
            r.cleared(w);
            Ok(Ok(()))
        })
    }

    /// Forgets the worker (blocks and cursor): whether it was known.
    fn remove_worker(&self, py: Python<'_>, worker_id: u64, dp_rank: u32) -> PyResult<bool> {
        let w = Worker::new(worker_id, dp_rank);
        self.call(py, "RouterIndex.remove_worker", |r| Ok(Ok(r.remove_worker(w))))
    }

    /// The seq the worker's cursor expects next (None: unknown worker, or no batch yet).
    fn next_seq(&self, py: Python<'_>, worker_id: u64, dp_rank: u32) -> PyResult<Option<u64>> {
        let w = Worker::new(worker_id, dp_rank);
        self.call(py, "RouterIndex.next_seq", |r| Ok(Ok(r.next_seq(w))))
    }

    /// Scores of `tokens` in namespace (`lora_name`, `cache_salt`): a list of
    /// `(worker_id, dp_rank, device_blocks, any_blocks)`, sorted by worker.
    fn find<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        lora_name: Option<String>,
        cache_salt: Option<String>,
    ) -> PyResult<Bound<'py, PyList>> {
        let t = to_input(tokens, "tokens")?;
        let tv = t.view();
        let out = self.call(py, "RouterIndex.find", |r| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out = Vec::new();
            r.find(toks, lora_name.as_deref(), cache_salt.as_deref(), &mut out);
            out.sort_unstable();
            Ok(Ok(out))
        })?;
        drop(t);
        scores_list(py, &out)
    }

    /// [`find`](Self::find) for content hashes (one per block, namespace mixed in).
    fn find_hashes<'py>(
        &self,
        py: Python<'py>,
        content_hashes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let c = to_input64(content_hashes, "content_hashes")?;
        let cv = c.view();
        let out = self.call(py, "RouterIndex.find_hashes", |r| {
            let mut sc = Vec::new();
            let hashes = cv.get("content_hashes", &mut sc).map_err(oor64)?;
            let mut out = Vec::new();
            r.find_hashes(hashes, &mut out);
            out.sort_unstable();
            Ok(Ok(out))
        })?;
        drop(c);
        scores_list(py, &out)
    }

    /// `(workers, blocks, memberships, bytes, events, batches, gaps, restarts, other_groups,
    /// refused_by)`, `refused_by` a list of `(reason, count)` in the core's order.
    fn stats(&self, py: Python<'_>) -> PyResult<Stats10> {
        self.call(py, "RouterIndex.stats", |r| {
            let s = r.stats();
            let by = Refusal::ALL.iter().map(|&x| (refusal_name(x), s.refused(x))).collect();
            Ok(Ok((
                s.workers,
                s.blocks,
                s.memberships,
                s.bytes,
                s.events,
                s.batches,
                s.gaps,
                s.restarts,
                s.other_groups,
                by,
            )))
        })
    }

    /// Frees the epoch garbage that can be freed now (read `stats()["bytes"]` after).
    fn reclaim(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, "RouterIndex.reclaim", |r| {
            r.reclaim();
            Ok(Ok(()))
        })
    }

    /// The heap bytes of an empty index with these options.
    fn empty_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.call(py, "RouterIndex.empty_bytes", |r| Ok(Ok(r.empty_bytes())))
    }

    /// Every worker's holdings and cursor, sorted by worker: a list of dicts with
    /// `worker_id`, `dp_rank`, `next_seq`, `blocks` (`(engine_hash, chain_key, media)`
    /// tuples sorted by engine hash; media bit 0 device, bit 1 host copy) and `groups`
    /// (`(group_idx, main_attention)` pairs: the KV cache group kinds its stores taught).
    fn dump<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let d = self.call(py, "RouterIndex.dump", |r| Ok(Ok(r.dump())))?;
        let out = PyList::empty(py);
        for wd in d {
            let rec = PyDict::new(py);
            rec.set_item("worker_id", wd.worker.worker_id)?;
            rec.set_item("dp_rank", wd.worker.dp_rank)?;
            rec.set_item("next_seq", wd.next_seq)?;
            let blocks =
                PyList::new(py, wd.blocks.iter().map(|b| (b.engine_hash, b.chain_key, b.media)))?;
            rec.set_item("blocks", blocks)?;
            let groups =
                PyList::new(py, wd.groups.iter().map(|g| (g.group_idx, g.main_attention)))?;
            rec.set_item("groups", groups)?;
            out.append(rec)?;
        }
        Ok(out)
    }
}

/// The namespace-mixed content hashes of `tokens`' full blocks (what `find_hashes` and
/// `stored_hashes` take), as the bytes of native `u64`s (`array('Q')` reads them).
#[pyfunction]
#[pyo3(signature = (tokens, block_size, lora_name=None, cache_salt=None))]
pub fn router_content_hashes<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    block_size: u32,
    lora_name: Option<String>,
    cache_salt: Option<String>,
) -> PyResult<Bound<'py, PyBytes>> {
    if block_size == 0 {
        return Err(PyValueError::new_err("block_size must be at least 1"));
    }
    let t = to_input(tokens, "tokens")?;
    let tv = t.view();
    let r = py.detach(|| {
        let mut sc = Vec::new();
        let toks = tv.get("tokens", &mut sc).map_err(oor)?;
        let mut out = Vec::new();
        radixkv_router::content_hashes(
            toks,
            block_size,
            lora_name.as_deref(),
            cache_salt.as_deref(),
            &mut out,
        );
        Ok(out.iter().flat_map(|h| h.to_ne_bytes()).collect::<Vec<u8>>())
    });
    let bytes = done(py, "radixkv.content_hashes", r)?;
    drop(t);
    Ok(PyBytes::new(py, &bytes))
}
