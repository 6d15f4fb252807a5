//! KV-event batches as Python rows (`drain_events` of the cache and of the tier).

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use radixkv::events::KvEvent;

/// Drained event batches as rows `(seq, ts, kind, medium, block_size, parent, hashes,
/// tokens, lora_name, cache_salt)` (see `NativeCache::drain_events`).
pub(crate) fn event_rows<'py>(
    py: Python<'py>,
    batches: Vec<(u64, radixkv::events::EventBatch)>,
    signed: bool,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    let hashes = |h: &[u64]| -> PyResult<Bound<'py, PyList>> {
        if signed {
            PyList::new(py, h.iter().map(|&x| x as i64))
        } else {
            PyList::new(py, h.iter().copied())
        }
    };
    let hash1 = |h: u64| -> PyResult<Bound<'py, PyAny>> {
        if signed {
            Ok((h as i64).into_pyobject(py)?.into_any())
        } else {
            Ok(h.into_pyobject(py)?.into_any())
        }
    };
    for (seq, batch) in batches {
        for ev in &batch.events {
            let item = match ev {
                KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_name,
                    cache_salt,
                    medium,
                } => {
                    let parent = match parent_block_hash {
                        Some(p) => hash1(*p)?,
                        None => py.None().into_bound(py),
                    };
                    PyTuple::new(
                        py,
                        [
                            seq.into_pyobject(py)?.into_any(),
                            batch.ts.into_pyobject(py)?.into_any(),
                            0u32.into_pyobject(py)?.into_any(),
                            medium.as_str().into_pyobject(py)?.into_any(),
                            block_size.into_pyobject(py)?.into_any(),
                            parent,
                            hashes(block_hashes)?.into_any(),
                            PyList::new(py, token_ids.iter().copied())?.into_any(),
                            lora_name.as_deref().into_pyobject(py)?.into_any(),
                            cache_salt.as_deref().into_pyobject(py)?.into_any(),
                        ],
                    )?
                }
                KvEvent::BlockRemoved { block_hashes, medium } => PyTuple::new(
                    py,
                    [
                        seq.into_pyobject(py)?.into_any(),
                        batch.ts.into_pyobject(py)?.into_any(),
                        1u32.into_pyobject(py)?.into_any(),
                        medium.as_str().into_pyobject(py)?.into_any(),
                        0u32.into_pyobject(py)?.into_any(),
                        py.None().into_bound(py),
                        hashes(block_hashes)?.into_any(),
                        PyList::empty(py).into_any(),
                        py.None().into_bound(py),
                        py.None().into_bound(py),
                    ],
                )?,
                KvEvent::AllBlocksCleared => PyTuple::new(
                    py,
                    [
                        seq.into_pyobject(py)?.into_any(),
                        batch.ts.into_pyobject(py)?.into_any(),
                        2u32.into_pyobject(py)?.into_any(),
                        "GPU".into_pyobject(py)?.into_any(),
                        0u32.into_pyobject(py)?.into_any(),
                        py.None().into_bound(py),
                        PyList::empty(py).into_any(),
                        PyList::empty(py).into_any(),
                        py.None().into_bound(py),
                        py.None().into_bound(py),
                    ],
                )?,
            };
            out.append(item)?;
        }
    }
    Ok(out)
}
