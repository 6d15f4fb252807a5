"""``radixkv.Request``: one request's trip through a pooled :class:`radixkv.Cache`, the
engine's cycle as one object (radixkv's ``Cache::admit`` and ``Request``)::

    req = cache.admit(prompt, ns)        # pins the cached prefix, allocates the rest
    reuse = req.cached_len               # tokens whose KV need not be computed
    # ... prefill into req.slots[reuse:] ...
    req.checkpoint()                     # cache what it has so far: others hit it now
    req.extend([next_token])             # decode: slots for new tokens, page by page
    req.finish()                         # cache prompt + output, free duplicates, unpin

or ``req.abort()`` (every slot back, nothing new cached; leaving a ``with cache.admit(...)
as req:`` block unfinished, or dropping the object, does it too)."""

from __future__ import annotations

from typing import Any

from ._cache import SlotBuffer, U32Array, _Unique


class Request(_Unique):
    """A request admitted by :meth:`Cache.admit` (see the module docs).

    ``slots`` (a :class:`SlotBuffer`, one per token: where each token's KV lives or will be
    written), ``cached_len`` (tokens found cached at admission), ``locked_len`` (tokens the
    cache pins for it: ``slots[:locked_len]`` belong to the cache, the rest are the
    request's until it finishes), ``len(req)`` (tokens so far), ``ns`` and ``priority``
    (what its inserts carry). After :meth:`finish` or :meth:`abort` it holds nothing and
    its methods raise :class:`InvalidArgumentError`; after the cache is closed (which
    aborts it) :class:`CacheClosedError`. One request's methods are not meant to be called
    from two threads at once: the second call is refused, never raced."""

    __slots__ = ("_cache", "_h", "ns", "priority", "_len", "cached_len", "locked_len", "slots", "_done")

    def __init__(self, cache: Any, ns: Any, priority: int, handle: int, state: Any):
        self._cache = cache
        self._h = handle
        self.ns = ns
        self.priority = priority
        self._done = False
        self._state(state)

    def _state(self, state: Any) -> None:
        self._len, self.cached_len, self.locked_len, self.slots = state

    @property
    def done(self) -> bool:
        """Whether it was finished or aborted."""
        return self._done

    def __len__(self) -> int:
        return self._len

    def extend(self, tokens: U32Array) -> None:
        """Appends ``tokens`` (generated ones, or the next prefill chunk), allocating slots
        for them page by page (evicting when short; :class:`OutOfSlotsError` with nothing
        changed when the pool cannot)."""
        self._state(self._cache._q.extend(self._h, tokens))

    def checkpoint(self) -> int:
        """Caches the request's whole pages so far and pins them (so other requests hit
        them now: chunked prefill, long decodes); where another request cached the same
        tokens first, it switches to the cached slots. Returns the tokens cached already."""
        existing, state = self._cache._q.checkpoint(self._h)
        self._state(state)
        return existing

    def finish(self) -> int:
        """Caches everything the request computed (its whole pages), frees the slots that
        duplicate cached ones and the spare ones, and releases its pin. Returns the tokens
        cached already. The request is done afterwards, also when this raises (then it
        was aborted: every slot back)."""
        try:
            return self._cache._q.finish(self._h)
        finally:
            self._done = True
            self.slots = SlotBuffer("I")
            self.locked_len = 0

    def abort(self) -> None:
        """Gives every slot the request holds back and releases its pin, caching nothing
        new."""
        self._cache._q.abort(self._h)
        self._done = True
        self.slots = SlotBuffer("I")
        self.locked_len = 0

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._done and not self._cache._n.closing:
            self.abort()

    def __del__(self) -> None:
        try:
            if not self._done and not self._cache._n.closing:
                self.abort()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "done" if self._done else "live"
        return (
            f"<radixkv.Request {self._h} len={self._len} cached_len={self.cached_len} "
            f"locked_len={self.locked_len} {state}>"
        )
