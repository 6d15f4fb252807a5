"""``RouterIndex``: many engines' KV caches in one lock-free index, for a KV-aware router
(``ROUTER.md``), over the Rust crate ``radixkv-router`` (``radixkv_router::RouterIndex``).

A router asks, per request, how many leading blocks of it each engine worker holds; the
index answers from the workers' KV-event streams (vLLM's msgpack batches through
:meth:`RouterIndex.apply_batch`, or the typed calls :meth:`~RouterIndex.stored`,
:meth:`~RouterIndex.removed`, :meth:`~RouterIndex.cleared`) while any number of threads call
:meth:`RouterIndex.find`. Every call releases the GIL inside the library.

    >>> import radixkv
    >>> r = radixkv.RouterIndex(block_size=4)
    >>> r.stored(1, [11, 12], list(range(8)))
    >>> r.find(list(range(12)))
    [Score(worker_id=1, dp_rank=0, device_blocks=2, any_blocks=2)]
"""

from __future__ import annotations

import operator
from array import array
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from . import _native
from ._cache import (
    U64_MAX,
    CacheClosedError,
    InvalidArgumentError,
    RadixKvError,
    Status,
    U32Array,
    _Unique,
)

_ext = _native.ext

U32_MAX = (1 << 32) - 1

#: ``gap_policy`` names: what a gap in a worker's batch ``seq`` does.
GAP_POLICIES = ("clear", "refuse")
#: ``medium`` names (case-insensitive): the device (GPU) pool or a host copy in pinned memory.
_MEDIA = {"gpu": 0, "cpu": 1, "cpu_pinned": 1}

#: The status of :class:`SequenceGapError`: ``RKV_SEQUENCE_GAP`` (``ROUTER.md``), 11, a
#: :class:`Status` member once the core's status table lists it.
SEQUENCE_GAP: int = int(_ext.SEQUENCE_GAP)

U64Array = Any  # list / tuple / array('Q'/'q') / NumPy uint64 or int64 array / any buffer


def _status(code: Optional[int]) -> Any:
    if code is None:
        return None
    try:
        return Status(code)
    except ValueError:
        return int(code)


# ---- errors ---------------------------------------------------------------------------


class RouterError(RadixKvError):
    """A refusal of the router index; ``status`` is its status code and the error's fields
    (``expected``, ``got``, ``worker``, ...) are attributes, never to be parsed from the
    message. Nothing of the refused call applied, except where a subclass says what did."""

    def __init__(self, message: str, status: Optional[int] = None, **fields: Any):
        Exception.__init__(self, message)
        if status is not None:
            self.status = _status(status)
        for k, v in fields.items():
            if k == "worker" and isinstance(v, tuple):
                v = Worker(*v)
            setattr(self, k, v)
        self.fields: Dict[str, Any] = {k: getattr(self, k) for k in fields}


class SequenceGapError(RouterError):
    """A batch's ``seq`` skips ahead of its worker's cursor under ``gap_policy="refuse"``:
    nothing applied. Replay the worker's batches from ``expected`` (also
    :meth:`RouterIndex.next_seq`), then retry. ``worker`` is a :class:`Worker`, ``got`` the
    batch's seq; ``status`` is ``RKV_SEQUENCE_GAP`` (11)."""

    status = _status(SEQUENCE_GAP)
    worker: "Worker"
    expected: int
    got: int


class MalformedBatchError(RouterError, InvalidArgumentError):
    """A payload that does not decode as a vLLM KV-event batch: nothing of it applied.
    ``reason`` is the decoder's (for a log line)."""

    reason: str


class UnknownParentError(RouterError, InvalidArgumentError):
    """A store under a ``parent`` hash the worker does not hold: nothing of it applied."""

    parent: int


class UnknownRemovalsError(RouterError, InvalidArgumentError):
    """``count`` hashes of a removal were not held in that medium (the held ones were
    removed)."""

    count: int


class UnalignedError(RouterError, InvalidArgumentError):
    """A store whose tokens are not ``blocks * block_size`` (``expected`` is the index's
    block size): nothing of it applied."""

    blocks: int
    tokens: int
    block_size: int
    expected: int


class EmptyStoreError(RouterError, InvalidArgumentError):
    """A store with no blocks."""


class TooManyWorkersError(RouterError, InvalidArgumentError):
    """A new worker when ``max_workers`` workers are live already: nothing applied."""

    max_workers: int


class BadDumpError(RouterError, InvalidArgumentError):
    """A dump record :meth:`RouterIndex.restore` cannot hold (``worker`` names it)."""

    worker: "Worker"


class RouterOptionsError(RouterError, InvalidArgumentError):
    """Options out of range (``block_size`` at least 1, ``max_workers`` 1 to 2**29)."""

    block_size: int
    max_workers: int


_ext._register_router_errors(
    {
        "SequenceGap": SequenceGapError,
        "Malformed": MalformedBatchError,
        "UnknownParent": UnknownParentError,
        "UnknownRemovals": UnknownRemovalsError,
        "Unaligned": UnalignedError,
        "Empty": EmptyStoreError,
        "TooManyWorkers": TooManyWorkersError,
        "BadDump": BadDumpError,
        "InvalidOptions": RouterOptionsError,
    }
)


# ---- results --------------------------------------------------------------------------


class Worker(NamedTuple):
    """An engine worker: its id and data-parallel rank."""

    worker_id: int
    dp_rank: int


class Score(NamedTuple):
    """One worker's answer to :meth:`RouterIndex.find`: the leading blocks of the request it
    holds on the device (GPU) and in any medium (device or a host copy; at least 1)."""

    worker_id: int
    dp_rank: int
    device_blocks: int
    any_blocks: int

    @property
    def worker(self) -> Worker:
        return Worker(self.worker_id, self.dp_rank)


class BatchReport(NamedTuple):
    """What :meth:`RouterIndex.apply_batch` did with a batch it accepted: its ``events``,
    how many were ``refused`` for their content (counted by reason in the stats), and
    whether the worker was ``cleared_first`` (a restart, or a gap under ``"clear"``)."""

    events: int
    refused: int
    cleared_first: bool


# ---- arguments ------------------------------------------------------------------------


def _int(x: Any, what: str, hi: int, lo: int = 0, unit: str = "") -> int:
    if isinstance(x, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        x = operator.index(x)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(x).__name__}") from None
    if not lo <= x <= hi:
        lo_s = "-2**63" if lo else "0"
        raise ValueError(f"{what} = {x} is out of range: must be in [{lo_s}, {unit or hi + 1})")
    return x


def _u64(x: Any, what: str) -> int:
    return _int(x, what, U64_MAX, unit="2**64")


def _u32(x: Any, what: str) -> int:
    return _int(x, what, U32_MAX, unit="2**32")


def _hash(x: Any, what: str) -> int:
    """A 64-bit hash: a negative int (a signed hash, as vLLM and SGLang may send) is taken as
    its two's-complement bits."""
    return _int(x, what, U64_MAX, lo=-(1 << 63), unit="2**64") & U64_MAX


def _name(x: Any, what: str) -> Optional[str]:
    if x is None:
        return None
    if not isinstance(x, str):
        raise TypeError(f"{what} must be a str or None, not {type(x).__name__}")
    return x


def _medium(m: Any) -> int:
    try:
        return _MEDIA[m.lower()]
    except (KeyError, AttributeError):
        raise InvalidArgumentError(
            f"medium must be one of 'gpu', 'cpu' (or 'cpu_pinned'), got {m!r}",
            Status.INVALID_ARGUMENT,
        ) from None


def _gap_policy(g: Any) -> int:
    try:
        return GAP_POLICIES.index(g.lower())
    except (ValueError, AttributeError):
        raise InvalidArgumentError(
            f"gap_policy must be one of {list(GAP_POLICIES)}, got {g!r}", Status.INVALID_ARGUMENT
        ) from None


def _options(block_size: Any, max_workers: Any, gap_policy: Any) -> Tuple[int, int, int]:
    bs = _int(block_size, "block_size", U32_MAX, unit="2**32")
    mw = _int(max_workers, "max_workers", U32_MAX, unit="2**32")
    if bs < 1 or mw < 1:
        raise RouterOptionsError(
            f"block_size ({bs}) and max_workers ({mw}) must be at least 1",
            Status.INVALID_ARGUMENT,
            block_size=bs,
            max_workers=mw,
        )
    return bs, mw, _gap_policy(gap_policy)


def content_hashes(
    tokens: U32Array,
    block_size: int,
    lora_name: Optional[str] = None,
    cache_salt: Optional[str] = None,
) -> array:
    """The namespace-mixed content hashes of ``tokens``' full blocks (a partial last block
    is ignored), as an ``array('Q')``: what :meth:`RouterIndex.find_hashes` and
    :meth:`RouterIndex.stored_hashes` take. Computed as Dynamo does (XXH3-64 of each
    block's tokens as little-endian ``u32``, seeded by the namespace)."""
    bs = _int(block_size, "block_size", U32_MAX, unit="2**32")
    raw = _ext.router_content_hashes(
        tokens, bs, _name(lora_name, "lora_name"), _name(cache_salt, "cache_salt")
    )
    return array("Q", raw)


# ---- the index ------------------------------------------------------------------------


class RouterIndex(_Unique):
    """The router index: per worker ``(worker_id, dp_rank)``, which blocks of which
    namespace (``lora_name``, ``cache_salt``) it holds, on the device or as a host copy.

    ``block_size``: tokens per block (every worker's). ``max_workers``: distinct live
    workers at most. ``gap_policy``: what a gap in a worker's batch ``seq`` does,
    ``"clear"`` (the worker is cleared, then the batch applies) or ``"refuse"`` (nothing
    applies; :class:`SequenceGapError` names the seq to replay from).

    Token arrays may be lists, tuples, any integer buffer (``array('I'/'q')``, NumPy arrays),
    CPU torch tensors or iterables, read as the cache reads them (buffers are copied while
    the GIL is held, then read without it; a value outside ``[0, 2**32)`` is a
    ``ValueError`` naming its position). Hash arrays (``block_hashes``, content hashes) are
    64-bit: ``array('Q'/'q')``, NumPy ``uint64``/``int64`` arrays (signed values as their
    bits), or sequences of ints in ``[-2**63, 2**64)`` (a negative hash as its bits).

    Refusals raise :class:`RouterError` subclasses with the error's fields as attributes;
    those of bad content (:class:`UnknownParentError`, :class:`UnalignedError`, ...) are also
    :class:`InvalidArgumentError` (a ``ValueError``). :meth:`close` (or leaving a ``with``
    block) frees the index; later calls raise :class:`CacheClosedError`.
    """

    def __init__(self, block_size: int = 16, max_workers: int = 4096, gap_policy: str = "clear"):
        self._n = _ext.NativeRouterIndex(*_options(block_size, max_workers, gap_policy))

    @classmethod
    def restore(
        cls,
        dump: List[Dict[str, Any]],
        block_size: int = 16,
        max_workers: int = 4096,
        gap_policy: str = "clear",
    ) -> "RouterIndex":
        """An index with these options holding exactly what ``dump`` (from :meth:`dump`)
        records: ``RouterIndex.restore(r.dump(), ...).dump() == r.dump()``."""
        native = _ext.NativeRouterIndex.restore(
            dump, *_options(block_size, max_workers, gap_policy)
        )
        self = cls.__new__(cls)
        self._n = native
        return self

    # -- options, lifetime --

    @property
    def block_size(self) -> int:
        return int(self._n.block_size)

    @property
    def max_workers(self) -> int:
        return int(self._n.max_workers)

    @property
    def gap_policy(self) -> str:
        return GAP_POLICIES[self._n.gap_policy]

    def close(self) -> None:
        """Frees the index (waiting for calls running in other threads). Further calls
        raise :class:`CacheClosedError`. Idempotent."""
        n = getattr(self, "_n", None)
        if n is not None:
            n.close()

    @property
    def closed(self) -> bool:
        return bool(self._n.closed)

    def __enter__(self) -> "RouterIndex":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.stats()['workers']} workers"
        return (
            f"<radixkv.RouterIndex block_size={self.block_size} max_workers={self.max_workers}"
            f" gap_policy={self.gap_policy!r} {state}>"
        )

    # -- events --

    def apply_batch(self, worker_id: int, seq: int, payload: Any) -> BatchReport:
        """Applies one vLLM KV-event batch ``payload`` (the msgpack frame: ``bytes``, or any
        bytes-like object, copied) numbered ``seq`` from worker ``worker_id`` (its dp rank is
        the payload's ``data_parallel_rank``). The worker's first batch sets its cursor; a
        ``seq`` below it is a restart (the worker is cleared, then the batch applies); a
        ``seq`` above it is a gap (see ``gap_policy``). A payload that does not decode raises
        :class:`MalformedBatchError` and changes nothing; events refused for their content
        are skipped and counted (``BatchReport.refused``)."""
        r = self._n.apply_batch(_u64(worker_id, "worker_id"), _u64(seq, "seq"), payload)
        return BatchReport(*r)

    def stored(
        self,
        worker_id: int,
        block_hashes: U64Array,
        token_ids: U32Array,
        parent: Optional[int] = None,
        dp_rank: int = 0,
        lora_name: Optional[str] = None,
        cache_salt: Optional[str] = None,
        medium: str = "gpu",
    ) -> None:
        """``BlockStored``: the worker stores the blocks named ``block_hashes`` (its engine
        hashes) below its block ``parent`` (None: the namespace's first block), with
        ``token_ids`` (``block_size`` per block), in ``medium`` (``"gpu"`` or ``"cpu"``)."""
        self._n.stored(
            _u64(worker_id, "worker_id"),
            _u32(dp_rank, "dp_rank"),
            block_hashes,
            token_ids,
            None if parent is None else _hash(parent, "parent"),
            _name(lora_name, "lora_name"),
            _name(cache_salt, "cache_salt"),
            _medium(medium),
        )

    def stored_hashes(
        self,
        worker_id: int,
        block_hashes: U64Array,
        content_hashes: U64Array,
        parent: Optional[int] = None,
        dp_rank: int = 0,
        medium: str = "gpu",
    ) -> None:
        """:meth:`stored` with the blocks' content hashes (from :func:`content_hashes`,
        namespace mixed in) instead of tokens."""
        self._n.stored_hashes(
            _u64(worker_id, "worker_id"),
            _u32(dp_rank, "dp_rank"),
            block_hashes,
            content_hashes,
            None if parent is None else _hash(parent, "parent"),
            _medium(medium),
        )

    def removed(
        self, worker_id: int, block_hashes: U64Array, dp_rank: int = 0, medium: str = "gpu"
    ) -> None:
        """``BlockRemoved``: the worker dropped its ``medium`` copy of ``block_hashes``. Hashes
        it does not hold there raise :class:`UnknownRemovalsError` (the held ones are
        removed all the same)."""
        self._n.removed(
            _u64(worker_id, "worker_id"), _u32(dp_rank, "dp_rank"), block_hashes, _medium(medium)
        )

    def cleared(self, worker_id: int, dp_rank: int = 0) -> None:
        """``AllBlocksCleared``: the worker holds nothing any more (its cursor is kept)."""
        self._n.cleared(_u64(worker_id, "worker_id"), _u32(dp_rank, "dp_rank"))

    def remove_worker(self, worker_id: int, dp_rank: int = 0) -> bool:
        """Forgets the worker, its blocks and its cursor: whether it was known."""
        return bool(self._n.remove_worker(_u64(worker_id, "worker_id"), _u32(dp_rank, "dp_rank")))

    def next_seq(self, worker_id: int, dp_rank: int = 0) -> Optional[int]:
        """The ``seq`` the worker's cursor expects next (None: an unknown worker, or one
        that has seen no batch)."""
        return self._n.next_seq(_u64(worker_id, "worker_id"), _u32(dp_rank, "dp_rank"))

    # -- queries --

    def find(
        self, tokens: U32Array, lora_name: Optional[str] = None, cache_salt: Optional[str] = None
    ) -> List[Score]:
        """Scores of ``tokens`` (cut into blocks; a partial last block is ignored) in the
        namespace (``lora_name``, ``cache_salt``): one :class:`Score` per worker holding the
        first block, sorted by worker."""
        raw = self._n.find(tokens, _name(lora_name, "lora_name"), _name(cache_salt, "cache_salt"))
        return [Score._make(s) for s in raw]

    def find_hashes(self, content_hashes: U64Array) -> List[Score]:
        """:meth:`find` for content hashes, one per block, namespace mixed in (as
        :func:`content_hashes` computes them)."""
        return [Score._make(s) for s in self._n.find_hashes(content_hashes)]

    def stats(self) -> Dict[str, Any]:
        """Counters and sizes (each read on its own: a snapshot only at quiescence):
        ``workers``, ``blocks`` (distinct), ``memberships`` ((block, worker, medium)
        holdings), ``bytes`` (the index's heap), ``events``, ``batches``, ``gaps``,
        ``restarts``, ``other_groups`` (events of a KV cache group other than full
        attention, a hybrid model's sliding-window or Mamba groups: skipped, not refused),
        ``refused`` (all refusals) and ``refused_by`` (by reason:
        ``malformed``, ``unknown_parent``, ``unknown_removal``, ``unaligned``, ``empty``,
        ``too_many_workers``, ``sequence_gap``)."""
        w, b, m, by, ev, ba, g, rs, og, refused = self._n.stats()
        refused_by = dict(refused)
        return {
            "workers": w,
            "blocks": b,
            "memberships": m,
            "bytes": by,
            "events": ev,
            "batches": ba,
            "gaps": g,
            "restarts": rs,
            "other_groups": og,
            "refused": sum(refused_by.values()),
            "refused_by": refused_by,
        }

    def reclaim(self) -> None:
        """Frees the retired memory that can be freed now (read ``stats()["bytes"]`` after)."""
        self._n.reclaim()

    def empty_bytes(self) -> int:
        """The heap bytes of an empty index with these options (what ``stats()["bytes"]``
        returns to once every worker is gone and :meth:`reclaim` ran)."""
        return int(self._n.empty_bytes())

    def dump(self) -> List[Dict[str, Any]]:
        """Every worker's holdings and cursor, sorted by worker: a list of dicts with
        ``worker_id``, ``dp_rank``, ``next_seq`` (None before a batch), ``blocks``, a list
        of ``(engine_hash, chain_key, media)`` tuples sorted by engine hash (``media``: bit 0
        the device copy, bit 1 a host copy), and ``groups``, a list of ``(group_idx,
        main_attention)`` pairs sorted by group: the KV cache groups whose kinds the
        worker's stores taught (where it differs from an unnamed group's: group 0 indexed,
        the others skipped), so that their removals are taken or skipped after a restore
        as before. :meth:`restore` rebuilds the index from it (a record without ``groups``,
        as dumps before them, learned none)."""
        return self._n.dump()


__all__ = [
    "GAP_POLICIES",
    "SEQUENCE_GAP",
    "BadDumpError",
    "BatchReport",
    "CacheClosedError",
    "EmptyStoreError",
    "MalformedBatchError",
    "RouterError",
    "RouterIndex",
    "RouterOptionsError",
    "Score",
    "SequenceGapError",
    "TooManyWorkersError",
    "UnalignedError",
    "UnknownParentError",
    "UnknownRemovalsError",
    "Worker",
    "content_hashes",
]
