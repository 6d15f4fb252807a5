"""An adapter with the method names of SGLang's ``RadixCache``
(``python/sglang/srt/mem_cache/radix_cache.py``), so an SGLang-style scheduler can swap
radixkv in:

    cache = RadixCache(page_size=1, pool_slots=0, free_slots=allocator.free)
    res = cache.match_prefix(RadixKey(token_ids, extra_key))   # or a plain list of ids
    req.prefix_indices, req.last_node = res.device_indices, res.last_device_node
    cache.inc_lock_ref(req.last_node)                          # pin while the request runs
    ...
    cache.insert(RadixKey(token_ids, extra_key), kv_indices)
    cache.dec_lock_ref(req.last_node)
    cache.evict(num_tokens)                                    # frees through free_slots

Differences from SGLang's class, all of them deliberate:

- ``match_prefix`` pins nothing; a node remembers the matched tokens and slots, and
  ``inc_lock_ref`` pins them with ``match_lock``. If the prefix changed in between (another
  thread evicted it: impossible in SGLang's single-threaded scheduler), ``inc_lock_ref``
  raises :class:`StaleNodeError` instead of pinning slots that are no longer the node's.
- ``device_indices`` are a ``SlotBuffer`` (an ``array('I')``; ``to_indices`` converts them, e.g.
  ``lambda a: torch.frombuffer(a, dtype=torch.int32).long()``).
- ``extra_key`` (SGLang's LoRA id) maps to an exact radixkv namespace; with a
  ``cache_salt`` (or a bigram key) the whole ``(extra_key, cache_salt)`` pair does, so
  tenants with the same ``extra_key`` stay apart. ``limit`` caps the key, and EAGLE's bigram
  keys cache one entry per bigram.
- ``inc_lock_ref`` / ``dec_lock_ref`` return the change of ``evictable_size()`` measured
  around the call, as SGLang's do; under concurrent use by several threads the figure
  includes their changes too.
"""

from __future__ import annotations

from array import array
from typing import Any, Callable, List, NamedTuple, Optional, Sequence

from ._cache import Cache, InvalidLockError, Lock, RadixKvError, Status


class StaleNodeError(RadixKvError):
    """``inc_lock_ref`` found the node's prefix evicted or changed since ``match_prefix``."""


class TreeNode:
    """What ``match_prefix`` returns as ``last_device_node``: the matched prefix (tokens,
    namespace, slots) and the locks ``inc_lock_ref`` took on it."""

    __slots__ = ("tokens", "ns", "value", "_locks", "__weakref__")

    def __init__(self, tokens: array, ns: Any, value: array):
        self.tokens = tokens
        self.ns = ns
        self.value = value  # the slots, as SGLang's TreeNode.value
        self._locks: List[Lock] = []

    @property
    def lock_ref(self) -> int:
        return len(self._locks)

    def __len__(self) -> int:
        return len(self.value)

    def __repr__(self) -> str:
        return f"<radixkv.sglang.TreeNode len={len(self.value)} lock_ref={self.lock_ref}>"


class MatchResult(NamedTuple):
    """As SGLang's ``MatchResult``; unpacks as ``(device_indices, last_device_node, ...)``."""

    device_indices: Any
    last_device_node: TreeNode
    last_host_node: TreeNode
    host_hit_length: int = 0


#: Where the adapter's interned ``(extra_key, cache_salt)`` namespaces start (int
#: ``extra_key`` namespaces must stay below it).
_SALTED_BASE = 1 << 62


def _key(key: Any, extra_key: Any = None) -> tuple:
    """``(tokens, extra_key, cache_salt, first)`` of a ``RadixKey``-like object or a plain
    sequence of ids: the tokens cut to ``limit``; for a bigram key (raw tokens ``t[0..n]``,
    ``n - 1`` bigrams) the tokens ``t[1:n]``, held under their first token ``first`` (two
    bigram keys share ``m`` bigrams exactly when they share ``t[0]`` and ``t[1:m + 1]``)."""
    if not hasattr(key, "token_ids"):
        return key, extra_key, None, None
    tokens = key.token_ids
    limit = getattr(key, "limit", None)
    if limit is not None and limit < len(tokens):
        tokens = tokens[:limit]
    salt = getattr(key, "cache_salt", None) or None
    ek = getattr(key, "extra_key", extra_key)
    if getattr(key, "is_bigram", False):
        if len(tokens) < 2:
            return tokens[:0], ek, salt, None
        return tokens[1:], ek, salt, int(tokens[0])
    return tokens, ek, salt, None


class RadixCache:
    """SGLang's ``RadixCache`` interface over a :class:`radixkv.Cache`.

    ``pool_slots=0`` (SGLang's setting: the scheduler owns a ``token_to_kv_pool_allocator``):
    ``evict`` hands the freed slots to ``free_slots(slots)`` (one ``SlotBuffer``), which it then requires
    (``ValueError`` otherwise, before evicting: the slots would be lost). With
    ``pool_slots=N`` the cache owns the slots (use ``cache.alloc`` / ``cache.free``).
    """

    def __init__(
        self,
        page_size: int = 1,
        pool_slots: int = 0,
        policy: str = "lru",
        free_slots: Optional[Callable[[List[int]], Any]] = None,
        to_indices: Optional[Callable[[array], Any]] = None,
        disable: bool = False,
    ):
        self.cache = Cache(page_size=page_size, pool_slots=pool_slots, policy=policy)
        self.page_size = page_size
        self.disable = disable
        self._free_slots = free_slots
        self._to_indices = to_indices or (lambda a: a)
        self.root_node = TreeNode(array("I"), None, array("I"))
        self._salted: dict = {}

    def _ns(self, extra_key: Any, salt: Any, first: Any) -> Any:
        """The namespace of a key: its ``extra_key`` alone (as before) when it has no cache
        salt and is not a bigram key, else an exact id interned for the whole tuple."""
        if salt is None and first is None:
            return extra_key
        k = (extra_key, salt, first)
        ns = self._salted.get(k)
        if ns is None:
            ns = self._salted.setdefault(k, _SALTED_BASE + len(self._salted))
        return ns

    # -- SGLang's methods --

    def reset(self) -> None:
        """Drops every unpinned page (pinned ones stay, with their locks)."""
        self.cache.reset()

    def match_prefix(self, key: Any, **kwargs: Any) -> MatchResult:
        """The longest cached prefix of ``key``: ``MatchResult(device_indices,
        last_device_node, last_host_node)``; the node is what ``inc_lock_ref`` takes."""
        tokens, ek, salt, first = _key(key, kwargs.get("extra_key"))
        ns = self._ns(ek, salt, first)
        if self.disable:
            slots = array("I")
            node = self.root_node
        else:
            slots = self.cache.match(tokens, ns)
            node = self.root_node if not slots else TreeNode(array("I", tokens[: len(slots)]), ns, slots)
        return MatchResult(self._to_indices(slots), node, node)

    def insert(self, key: Any, value: Optional[Sequence[int]] = None, **kwargs: Any) -> int:
        """Caches ``key`` with ``value`` (its KV indices; SGLang's default, the token ids
        themselves, when None). Returns the length of the prefix that was cached already."""
        tokens, ek, salt, first = _key(key, kwargs.get("extra_key"))
        if self.disable:
            return 0
        ns = self._ns(ek, salt, first)
        if value is None:
            value = key.token_ids if first is not None else tokens  # SGLang: the raw tokens
        n = len(tokens)
        return self.cache.insert(tokens, value[:n] if len(value) > n else value, ns)

    def evict(self, num_tokens: int) -> int:
        """Evicts at least ``num_tokens`` tokens; the freed slots go to ``free_slots`` (or
        back to the pool). Returns the number of tokens evicted."""
        if self.disable:
            return 0
        if self.cache.pool_slots == 0 and self._free_slots is None:
            # SGLang frees evicted slots through its allocator; without one they would be
            # lost. Refused before anything is evicted.
            raise ValueError(
                "evict needs free_slots (the allocator's free) when the slots are the caller's "
                "(pool_slots=0): the evicted slots would be lost"
            )
        freed = self.cache.evict(num_tokens)
        if freed and self._free_slots is not None and self.cache.pool_slots == 0:
            self._free_slots(freed)
        return len(freed)

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Pins ``node``'s prefix; returns the change of ``evictable_size()`` (<= 0)."""
        if self.disable or node is self.root_node or len(node.value) == 0:
            return 0
        before = self.evictable_size()
        lock = self.cache.match_lock(node.tokens, node.ns)
        if lock.slots != node.value:
            lock.release()
            raise StaleNodeError(
                f"the node's prefix ({len(node.value)} tokens) was evicted or changed since "
                f"match_prefix (now {lock.length} tokens match)"
            )
        node._locks.append(lock)
        return self.evictable_size() - before

    def dec_lock_ref(self, node: TreeNode, *args: Any, **kwargs: Any) -> int:
        """Unpins what one ``inc_lock_ref(node)`` pinned; returns the change of
        ``evictable_size()`` (>= 0)."""
        if self.disable or node is self.root_node or len(node.value) == 0:
            return 0
        if not node._locks:
            raise InvalidLockError("dec_lock_ref: the node is not locked", Status.INVALID_LOCK)
        before = self.evictable_size()
        node._locks.pop().release()
        return self.evictable_size() - before

    def evictable_size(self) -> int:
        return self.cache.stats().evictable_tokens

    def protected_size(self) -> int:
        return self.cache.stats().protected_tokens

    def total_size(self) -> int:
        return self.cache.stats().cached_tokens

    def pretty_print(self) -> None:
        s = self.cache.stats()
        print(f"#tokens: {s.cached_tokens}, #nodes: {s.nodes}, protected: {s.protected_tokens}")


# ---- the SGLang 0.5.x backend ---------------------------------------------------------

_BACKEND_NAMES = ("RadixKvCache", "RadixKvNode")


def __getattr__(name: str) -> Any:
    """``RadixKvCache``, ``RadixKvNode`` and ``register`` come from
    ``radixkv._sglang_backend``, imported on first use: it imports SGLang (and torch), which
    the rest of the package never needs."""
    if name in _BACKEND_NAMES:
        from . import _sglang_backend

        return getattr(_sglang_backend, name)
    if name in ("RadixKvHiCache", "HiNode"):
        # The host tier's mapping (radixkv/_sglang_hicache.py says what maps and what not).
        from . import _sglang_hicache

        return getattr(_sglang_hicache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> bool:
    """Registers ``RadixKvCache`` with SGLang as the radix-cache backend ``radixkv``
    (``--radix-cache-backend radixkv``) and the tree core ``radixkv`` of its
    ``UnifiedRadixCache`` (:func:`register_tree_core`); False if the radix-cache backend was
    registered already. SGLang's plugin loader calls it through the package's
    ``sglang.srt.plugins`` entry point; it does nothing (False) when SGLang is not
    installed."""
    register_tree_core()
    try:
        from . import _sglang_backend
    except ImportError:
        return False
    return _sglang_backend.register()


# ---- the tree core of SGLang's UnifiedRadixCache ------------------------------------------


def tree_core_factory(params: Any, components: Any) -> Any:
    """SGLang's tree-core factory for ``radixkv`` (``register_tree_core_backend``): radixkv's
    tree core for ``[FULL]`` and ``[FULL, SWA]``; any configuration it cannot run goes to SGLang's Python
    ``UnifiedTreeCore``, with a ``logging.warning`` saying why."""
    from . import _sglang_tree_core

    return _sglang_tree_core.create(params, components)


def tree_core_inspector_factory(params: Any, components: Any) -> Any:
    """The same, with the white-box methods SGLang's unified-cache test kit asserts
    (``UnifiedTreeCoreInspectionInterface``): for tests only, as SGLang's own inspectors."""
    from . import _sglang_tree_core

    return _sglang_tree_core.create(params, components, inspector=True)


def register_tree_core() -> bool:
    """Registers :func:`tree_core_factory` as SGLang's tree core ``radixkv``
    (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=radixkv`` or
    ``CacheInitParams.tree_core_backend="radixkv"``). Importing this module arranges it:
    at once when SGLang's tree-core registry is loaded already, else right after SGLang
    loads it (importing radixkv imports neither SGLang nor torch). False, without an error,
    when it was registered already or SGLang (0.5.23 or later, with
    ``register_tree_core_backend``) is not installed."""
    import importlib.util

    try:
        if importlib.util.find_spec("sglang") is None:
            return False
        from sglang.srt.mem_cache.unified_cache.tree_core_registry import (
            get_tree_core_factory,
            register_tree_core_backend,
        )
    except Exception:  # no SGLang, or one without pluggable tree cores
        return False
    if get_tree_core_factory("radixkv") is not None:
        return False
    register_tree_core_backend("radixkv", tree_core_factory)
    return True


_REGISTRY_MODULE = "sglang.srt.mem_cache.unified_cache.tree_core_registry"


class _RegisterWhenImported:
    """A ``sys.meta_path`` finder that registers the tree core right after SGLang's
    tree-core registry module is first imported, so that importing radixkv (which imports
    this module) does not import SGLang and torch (seconds) for programs that never use
    them. It finds nothing itself: it wraps the loader the other finders find."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _REGISTRY_MODULE:
            return None
        import importlib.util
        import sys

        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once; and no recursion through find_spec below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        inner = spec.loader

        class _Loader:
            def create_module(self, spec: Any) -> Any:
                return inner.create_module(spec)

            def exec_module(self, module: Any) -> None:
                inner.exec_module(module)
                try:
                    register_tree_core()
                except Exception:  # never break SGLang's own import
                    pass

        spec.loader = _Loader()
        return spec


def _register_now_or_on_import() -> None:
    import sys

    if _REGISTRY_MODULE in sys.modules:
        register_tree_core()
    elif not any(isinstance(f, _RegisterWhenImported) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWhenImported())


# On import: registered now when SGLang's registry is loaded already, else as soon as it is.
_register_now_or_on_import()
