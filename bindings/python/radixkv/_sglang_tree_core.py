"""``RadixKvTreeCore``: radixkv as the tree core of SGLang 0.5.23's ``UnifiedRadixCache``.

SGLang's default cache drives its tree through ``UnifiedTreeCoreInterface`` ("the tree
decides, the cache executes"). This class implements that interface for the component sets
``[FULL]``, ``[FULL, SWA]``, ``[FULL, MAMBA]`` and ``[FULL, SWA, MAMBA]`` over radixkv's
native ``NativeTreeCore``
(``bindings/python/src/tree_core/``): each interface call is one native call, keys cross as the request's own int64 buffer, and
the device indices the tree hands back (duplicates to free, evicted leaves, matched paths)
come back as one int64 buffer each, viewed as a tensor without a copy.

SWA follows SGLang's ``components/swa.py`` in the native tree (window-valid matches, the
window-bounded SWA LRU, window locks with boundary stamps in the receipt, tombstones, the
insert's SWA actions with ``SWARebuild`` as a barrier, the SWA eviction walk), and Mamba
its ``components/mamba.py`` (one state per node where a sequence ended, left on the suffix
by a split, a lock on the node alone, Mamba tombstones, the Mamba LRU refreshed by a match's
chosen node, the Mamba eviction walk, an SWA tombstone taking the node's state with it, the
per-path state cap as its ``MambaEvictExcessPathStates`` barrier); see
bindings/python/README.md.

What this slice does not run -- sessions, component overrides,
EAGLE bigram keys, eviction policies other than ``lru``, KV events, HiCache / storage /
the external cache linker, logical-page KV sharding -- is refused by ``unsupported_reason``
before construction; ``radixkv.sglang``'s factory then hands the configuration to SGLang's
Python ``UnifiedTreeCore`` with a warning naming the reason. A host-tier setter switched on
after construction (``set_hicache_enabled``, ``enable_storage = True``, ...) raises
``NotImplementedError`` rather than run wrongly.

Imported only when SGLang is installed (``radixkv.sglang`` loads it on first use).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    DecLockRefParams,
    DecLockRefResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.events import KVCacheEventRecorder
from sglang.srt.mem_cache.unified_cache.cache_action import (
    FreeDeviceKV,
    FreeDeviceKVFullOnly,
    MambaEvictExcessPathStates,
    RecoverSWAWithLockedFull,
    SWARebuild,
)
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import (
    DecSwaLockOnlyResult,
    DemoteResult,
    DriveHostEvictionResult,
    DropSubtreeNoHostResult,
    EvictDeviceLeafResult,
    EvictDeviceNextNodeResult,
    InsertStepResult,
    NodeId,
    RadixCacheWalkResult,
    TreePathNodeInfo,
    UnifiedTreeCoreInterface,
)

from ._native import ext as _ext

FULL = ComponentType.FULL
SWA = ComponentType.SWA
MAMBA = ComponentType.MAMBA

#: The component sets this tree core runs.
SUPPORTED_COMPONENTS = ((FULL,), (FULL, SWA), (FULL, MAMBA), (FULL, SWA, MAMBA))


def _match_result(
    n: int, node: int, hit: int, last: Optional[int], branching=None, mamba_branching=None
) -> MatchResult:
    return MatchResult(
        swa_branching_seqlen=branching,
        mamba_branching_seqlen=mamba_branching,
        device_prefix_len=n,
        last_device_node=node,
        last_host_node=node,
        best_match_node=node,
        host_hit_length=0,
        last_visited_node_id=last,
        full_kv_hit_length=hit,
        cache_actions=[],
    )


def unsupported_reason(params) -> Optional[str]:
    """Why this slice's tree core cannot serve ``params`` (a ``CacheInitParams``), or None."""
    components = tuple(params.tree_components or ())
    if components not in SUPPORTED_COMPONENTS:
        names = ", ".join(c.name for c in components) or "none"
        return (
            "the radixkv tree core runs the component sets [FULL], [FULL, SWA], [FULL, MAMBA] "
            f"and [FULL, SWA, MAMBA], not [{names}]"
        )
    if SWA in components:
        window = params.swa_retain_window
        if window is None or window <= 0:
            return "SWA needs a positive sliding_window_size"
        if not params.swa_gates_prefix_match:
            return "SWA with swa_gates_prefix_match=False is not in the radixkv tree core yet"
    if params.enable_session_radix_cache:
        return "session-aware caching (--enable-session-radix-cache) is not in the radixkv tree core yet"
    if params.component_registry_override:
        return "custom components (component_registry_override) need SGLang's Python tree core"
    if params.is_eagle and MAMBA not in components:  # with Mamba, SGLang keys by tokens too
        return "EAGLE bigram keys are not in the radixkv tree core yet"
    policy = (params.eviction_policy or "lru").lower()
    if policy != "lru":
        return f"the radixkv tree core evicts by lru only, not {policy!r}"
    if params.enable_kv_cache_events:
        return "KV cache events are not emitted by the radixkv tree core yet"
    allocator = params.token_to_kv_pool_allocator
    if allocator is not None:
        try:
            from sglang.srt.mem_cache.allocator.page_interleave import page_interleave_shard_size

            if page_interleave_shard_size(allocator) > 1:
                return "logical-page KV sharding needs rotation bases, which the radixkv tree core does not track"
        except ImportError:  # an SGLang without sharding
            pass
    try:
        from sglang.srt.server_args import get_global_server_args

        server_args = get_global_server_args()
    except Exception:  # no server (a unit test, a replay): no host tier either
        server_args = None
    if server_args is not None and getattr(server_args, "enable_hierarchical_cache", False):
        return "HiCache (--enable-hierarchical-cache) is not in the radixkv tree core yet"
    return None


def _no_host(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"{what}: the radixkv tree core keeps no host tier in this release (HiCache, storage "
        "and the external cache linker need SGLang's Python tree core: "
        "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python)"
    )


class RadixKvTreeCore(UnifiedTreeCoreInterface):
    """SGLang's tree core for ``[FULL]``, ``[FULL, SWA]``, ``[FULL, MAMBA]`` and
    ``[FULL, SWA, MAMBA]`` on radixkv's native tree (see the module docs)."""

    supports_rotation_base = False
    write_back_duplicate_reclaim_digest = 0
    is_eagle = False

    def __init__(self, params, components=None):
        reason = unsupported_reason(params)
        if reason is not None:
            raise ValueError(reason)
        self.page_size = params.page_size
        allocator = params.token_to_kv_pool_allocator
        self.device = torch.device(allocator.device) if allocator is not None else torch.device("cpu")
        self._cpu = self.device.type == "cpu"
        self._swa = SWA in tuple(params.tree_components or ())
        self.sliding_window_size = params.swa_retain_window if self._swa else None
        self._mamba = MAMBA in tuple(params.tree_components or ())
        # Mamba's component (the cache's): its checkpoint grid and per-path state cap are
        # read from it, as SGLang's tree core reads them, so that a change to one is seen
        # by both cores.
        self._mamba_component = (components or {}).get(MAMBA) if self._mamba else None
        self._mamba_grid = None
        if self._mamba and self._mamba_component is None:
            from sglang.srt.runtime_context import mamba_checkpoint_grid

            self._mamba_grid = mamba_checkpoint_grid(params.page_size)
        self._mamba_dtype = torch.int64
        self._native = _ext.NativeTreeCore(
            self.page_size, swa_window=self.sliding_window_size or 0, mamba=self._mamba
        )
        self._pending_insert: Optional[tuple] = None
        self._enable_hicache = False
        self._enable_storage = False
        self._enable_linker = False
        self._is_write_back = False
        self._has_swa_host_pool = False
        self.is_host_memory_buffer_only = False
        self.write_through_threshold = 256
        self.kv_events = KVCacheEventRecorder(
            enabled=False,
            page_size=self.page_size,
            dynamo_format=params.dynamo_kv_event_format,
            lora_names=params.kv_event_lora_names,
        )
        # Namespaces: (extra_key, cache_salt) -> the number the native tree keys children by.
        self._ns = {(None, None): 0}
        self._ns_names = [(None, None)]
        self._ongoing_insert = False
        self._walk_component: Optional[ComponentType] = None
        self.reset()

    # ==== the flags the cache sets: host tiers refused, never half-run ====

    @property
    def enable_hicache(self) -> bool:
        return self._enable_hicache

    @property
    def enable_storage(self) -> bool:
        return self._enable_storage

    @enable_storage.setter
    def enable_storage(self, value: bool) -> None:
        if value:
            raise _no_host("enable_storage")
        self._enable_storage = False

    @property
    def enable_external_cache_linker(self) -> bool:
        return self._enable_linker

    @enable_external_cache_linker.setter
    def enable_external_cache_linker(self, value: bool) -> None:
        if value:
            raise _no_host("enable_external_cache_linker")
        self._enable_linker = False

    @property
    def is_write_back(self) -> bool:
        return self._is_write_back

    @is_write_back.setter
    def is_write_back(self, value: bool) -> None:
        if value:
            raise _no_host("is_write_back")
        self._is_write_back = False

    @property
    def has_swa_host_pool(self) -> bool:
        return self._has_swa_host_pool

    @has_swa_host_pool.setter
    def has_swa_host_pool(self, value: bool) -> None:
        if value:
            raise _no_host("has_swa_host_pool")
        self._has_swa_host_pool = False

    def set_hicache_enabled(self) -> None:
        raise _no_host("set_hicache_enabled")

    def set_host_memory_buffer_only(self) -> None:
        raise _no_host("set_host_memory_buffer_only")

    # ==== helpers ====

    def _ns_of(self, key) -> int:
        name = (key.extra_key, key.cache_salt)
        ns = self._ns.get(name)
        if ns is None:
            ns = len(self._ns_names)
            self._ns[name] = ns
            self._ns_names.append(name)
        return ns

    @staticmethod
    def _bigram(key) -> None:
        raise ValueError("the radixkv tree core takes token keys, not EAGLE bigram views")

    def _tensor(self, buf) -> torch.Tensor:
        t = torch.frombuffer(buf, dtype=torch.int64) if len(buf) else self._empty_cpu
        return t if self._cpu else t.to(self.device)

    def _mtensor(self, buf) -> torch.Tensor:
        """A Mamba state (int64 bytes) as the tensor it came in as (dtype, device)."""
        t = torch.frombuffer(buf, dtype=torch.int64) if len(buf) else self._empty_cpu
        if self._mamba_dtype != torch.int64:
            t = t.to(self._mamba_dtype)
        return t if self._cpu else t.to(self.device)

    def _mamba_state(self, value) -> "object":
        """A Mamba state for the native tree (int64, on the CPU); refused unless 1-D."""
        if value is None:
            raise ValueError("insert: a Mamba tree core needs InsertParams.mamba_value; nothing was inserted")
        if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.numel() == 0:
            raise ValueError(
                f"insert: mamba_value must be a non-empty 1-D tensor of state slots, got {value!r}; "
                "nothing was inserted"
            )
        self._mamba_dtype = value.dtype
        return value.detach().to("cpu", torch.int64).contiguous().numpy()

    def _grid(self) -> int:
        comp = self._mamba_component
        return comp.mamba_checkpoint_grid if comp is not None else self._mamba_grid

    def _mamba_cap(self) -> int:
        comp = self._mamba_component
        if comp is not None:
            return comp.mamba_max_states_per_path
        from sglang.srt.runtime_context import get_exec

        return get_exec().mamba.mamba_max_states_per_path

    def _check_component(self, component_type: ComponentType, what: str) -> None:
        if component_type == MAMBA and self._mamba:
            return
        if component_type != FULL and not (component_type == SWA and self._swa):
            raise ValueError(f"{what}: component {component_type!r} is not in this tree core")

    # ==== Tree API ====

    def reset(self) -> None:
        if self._ongoing_insert:
            self._ongoing_insert = False
        self._pending_insert = None
        self._native.reset()
        self._walk_component = None
        self._root = self._native.root_id()
        self._empty_cpu = torch.empty((0,), dtype=torch.int64)
        self._empty_device = torch.empty((0,), dtype=torch.int64, device=self.device)
        self._empty_match_result = MatchResult(
            device_prefix_len=0,
            last_device_node=self._root,
            last_host_node=self._root,
            best_match_node=self._root,
            cache_actions=[],
        )

    def node_by_id(self, node_id: NodeId):
        raise NotImplementedError(
            "node_by_id: the radixkv tree core keeps its nodes natively (no Python node objects)"
        )

    @property
    def root_node(self):
        raise NotImplementedError(
            "root_node: the radixkv tree core keeps its nodes natively; use root_node_handle()"
        )

    def is_write_through_compatible(self) -> bool:
        return True  # no host values at all

    def is_backuped(self, node_id: NodeId) -> bool:
        self._native.node_info(node_id)  # KeyError for a missing node
        return False

    def is_root(self, node_id: NodeId) -> bool:
        return self._native.is_root(node_id)

    def get_last_hash_value(self, node_id: NodeId) -> Optional[str]:
        self._native.node_info(node_id)
        return None  # nodes are hashed only for storage, which this core refuses

    def get_prefix_hash_values(self, node_id: NodeId) -> list[str]:
        self._native.node_info(node_id)
        return []

    def get_hash_values(self, node_id: NodeId) -> list[str]:
        self._native.node_info(node_id)
        return []

    def snapshot_buffer_backup(self, node_id: NodeId, pass_prefix_keys: bool):
        raise _no_host("snapshot_buffer_backup")

    def validate_buffer_backup(self, node_id: NodeId, expected_key_length: int):
        raise _no_host("validate_buffer_backup")

    def backfill_missing_hash_values(self) -> int:
        raise _no_host("backfill_missing_hash_values")

    def root_node_handle(self, extra_key: Optional[str] = None) -> NodeId:
        return self._root

    def dfs_weight_order(self, node_ids: Sequence[NodeId]) -> list[int]:
        # SGLang's _dfs_weight_order over the native structure: request indices grouped by
        # their node, heavier subtrees first, depth first.
        native = self._native
        by_node: dict[int, list[int]] = {}
        for i, nid in enumerate(node_ids):
            native.node_info(nid)
            by_node.setdefault(nid, []).append(i)
        weight = {n: len(ix) for n, ix in by_node.items()}
        order = native.dfs()
        children = {n: native.children(n) for n in order}
        for n in reversed(order):
            w = weight.get(n, 0)
            for c in children[n]:
                w += weight.get(c, 0)
            weight[n] = w
        out: list[int] = []
        stack = [(self._root, False)]
        while stack:
            n, visited = stack.pop()
            if visited:
                out.extend(by_node.get(n, ()))
                continue
            kids = sorted(children[n], key=lambda c: -weight.get(c, 0))
            stack.append((n, True))
            stack.extend((c, False) for c in reversed(kids))
        return out

    def collect_path_info(self, end_node_ids: Sequence[NodeId]):
        native = self._native
        paths = []
        for nid in end_node_ids:
            chain = []
            cur = nid
            while not native.is_root(cur):
                parent, key_len, vlen, _, nchildren, _, _ = native.node_info(cur)
                chain.append((cur, parent, key_len, vlen, nchildren))
                cur = parent
            path = []
            start = 0
            for cur, parent, key_len, vlen, nchildren in reversed(chain):
                end = start + key_len
                path.append(TreePathNodeInfo(cur, parent, start, end, None if vlen < 0 else vlen, nchildren))
                start = end
            paths.append(tuple(path))
        return tuple(paths)

    # ==== locks ====

    def inc_lock_ref(self, node_id: NodeId, skip_lock_components: Sequence[ComponentType] = ()) -> IncLockRefResult:
        skipped = tuple(skip_lock_components)
        if FULL in skipped:
            self._native.node_info(node_id)
            result = IncLockRefResult(node_id=node_id, skipped_lock_components=skipped)
        else:
            delta = self._native.inc_lock_ref(node_id)
            result = IncLockRefResult(delta=delta, node_id=node_id, skipped_lock_components=skipped)
        if self._swa and SWA not in skipped:
            uuid = self._native.swa_inc_lock(node_id)
            result.set_lock_uuid(SWA, uuid or None)
        if self._mamba and MAMBA not in skipped:
            self._native.mamba_inc_lock(node_id)  # the node alone
        return result

    @staticmethod
    def _check_receipt(node_id: NodeId, params: DecLockRefParams) -> None:
        # SGLang's rule: a receipt releases only the node its acquire returned.
        assert params.node_id == node_id, (
            f"lock receipt anchored on node {params.node_id} released on node {node_id}"
        )

    def dec_lock_ref(self, node_id: NodeId, params: DecLockRefParams, skip_swa: bool = False) -> DecLockRefResult:
        self._check_receipt(node_id, params)
        # SGLang's order: the auxiliary components first (the last first), then FULL. After
        # an early SWA release, SWA and Mamba (a lower priority) are already released.
        if self._mamba and MAMBA not in params.skipped_lock_components and not (skip_swa and self._swa):
            self._native.mamba_dec_lock(node_id)
        if self._swa and SWA not in params.skipped_lock_components and not skip_swa:
            uuid = params.get_lock_uuid(SWA)
            if not self._native.is_root(node_id):
                self._native.swa_dec_lock(node_id, uuid or 0)
        if FULL not in params.skipped_lock_components:
            self._native.dec_lock_ref(node_id)
        else:
            self._native.node_info(node_id)
        return DecLockRefResult()

    def dec_swa_lock_only(self, node_id: NodeId, params: DecLockRefParams) -> DecSwaLockOnlyResult:
        self._check_receipt(node_id, params)
        result = DecSwaLockOnlyResult()
        if not self._swa or self._native.is_root(node_id):
            self._native.node_info(node_id)
            return result  # no SWA component (or the root): nothing to release early
        freed = self._native.dec_swa_lock_only(node_id, params.get_lock_uuid(SWA) or 0)
        if len(freed):
            result.device_frees[SWA].append(self._tensor(freed))
        # The locks of a lower priority than SWA's go too: Mamba's, where the lock took it.
        if self._mamba and MAMBA not in params.skipped_lock_components:
            self._native.mamba_dec_lock(node_id)
        return result

    def inc_full_pin(self, node_id: NodeId) -> None:
        self._native.inc_lock_ref(node_id)

    def dec_full_pin(self, node_id: NodeId) -> None:
        self._native.dec_lock_ref(node_id)

    def inc_host_lock_ref(self, node_id: NodeId) -> IncLockRefResult:
        # SGLang's FULL host lock takes nothing on a node without a host value (all of them).
        self._native.node_info(node_id)
        return IncLockRefResult(node_id=node_id)

    def dec_host_lock_ref(self, node_id: NodeId, params: DecLockRefParams) -> DecLockRefResult:
        self._check_receipt(node_id, params)
        self._native.node_info(node_id)
        return DecLockRefResult()

    # ==== device eviction, step-wise ====

    def evict_device_start(self, component_type: ComponentType, request_cnt: int) -> None:
        self._check_component(component_type, "evict_device_start")
        if component_type == SWA:
            self._native.swa_evict_start(max(0, int(request_cnt)))
        elif component_type == MAMBA:
            self._native.mamba_evict_start(max(0, int(request_cnt)))
        else:
            self._native.evict_start(max(0, int(request_cnt)))
        self._walk_component = component_type

    def evict_device_next_node(self, component_type: ComponentType, tracker) -> EvictDeviceNextNodeResult:
        self._check_component(component_type, "evict_device_next_node")
        if component_type == SWA:
            step = self._native.swa_evict_next(tracker.get(SWA, 0))
            if step is None:
                return EvictDeviceNextNodeResult(made_progress=False)
            node_id, full, state = step
            if full is None:  # a device leaf: the controller evicts it whole
                return EvictDeviceNextNodeResult(node_id=node_id, made_progress=True)
            # An internal node made an SWA tombstone: its SWA slots, freed by FULL index,
            # and its Mamba state with them (SGLang's cascade).
            result = EvictDeviceNextNodeResult(made_progress=True)
            result.device_frees[SWA].append(self._tensor(full))
            result.tracker[SWA] = len(full) // 8
            if state is not None:
                result.device_frees[MAMBA].append(self._mtensor(state))
                result.tracker[MAMBA] = len(state) // 8
            return result
        if component_type == MAMBA:
            step = self._native.mamba_evict_next(tracker.get(MAMBA, 0))
            if step is None:
                return EvictDeviceNextNodeResult(made_progress=False)
            node_id, state = step
            if state is None:  # a device leaf: the controller evicts it whole
                return EvictDeviceNextNodeResult(node_id=node_id, made_progress=True)
            # A Mamba tombstone: the state goes, the node's KV stays.
            result = EvictDeviceNextNodeResult(made_progress=True)
            result.device_frees[MAMBA].append(self._mtensor(state))
            result.tracker[MAMBA] = len(state) // 8
            return result
        node_id = self._native.evict_next(tracker.get(FULL, 0))
        return EvictDeviceNextNodeResult(node_id=node_id, made_progress=node_id is not None)

    def evict_device_leaf(self, node_id: NodeId, is_write_back: bool) -> EvictDeviceLeafResult:
        if is_write_back:
            raise _no_host("evict_device_leaf(is_write_back=True)")
        swa_len = self._native.swa_info(node_id)[0] if self._swa else -1
        state = self._native.mamba_value(node_id) if self._mamba else None
        freed = self._native.evict_leaf(node_id)
        n = len(freed) // 8
        result = EvictDeviceLeafResult(unbacked_tokens=n)
        full = self._tensor(freed)
        result.device_frees[FULL].append(full)
        result.tracker[FULL] = n
        if swa_len >= 0:  # its SWA slots go too (SGLang frees SWA by FULL index)
            result.device_frees[SWA].append(full)
            result.tracker[SWA] = swa_len
        if state is not None:  # and its Mamba state
            result.device_frees[MAMBA].append(self._mtensor(state))
            result.tracker[MAMBA] = len(state) // 8
        return result

    def finish_mamba_state_eviction(self, node_id: NodeId) -> EvictDeviceNextNodeResult:
        # The Mamba walk asks for an internal backup (InternalStateBackup) only with a
        # write-back host tier, which this core refuses: there is never a pending one.
        if not self._mamba:
            raise ValueError("finish_mamba_state_eviction: no Mamba component in this tree core")
        raise ValueError(f"finish_mamba_state_eviction: no pending internal Mamba eviction (node {node_id})")

    def finish_swa_state_eviction(self, node_id: NodeId) -> EvictDeviceNextNodeResult:
        # The SWA walk asks for an internal backup (InternalStateBackup) only with a host
        # SWA pool, which this core refuses: there is never a pending one to finish.
        raise ValueError(f"finish_swa_state_eviction: no pending internal SWA eviction (node {node_id})")

    def drop_subtree_no_host(self, node_id: NodeId) -> DropSubtreeNoHostResult:
        raise _no_host("drop_subtree_no_host")

    def demote(self, node_id: NodeId) -> DemoteResult:
        raise _no_host("demote")

    def evict_device_end(self, component_type: ComponentType) -> None:
        if component_type == SWA and self._swa:
            self._native.swa_evict_end()
        elif component_type == MAMBA and self._mamba:
            self._native.mamba_evict_end()
        else:
            self._native.evict_end()
        self._walk_component = None

    # ==== sizes ====

    def evictable_size(self) -> int:
        return self._native.sizes()[0]

    def protected_size(self) -> int:
        return self._native.sizes()[1]

    def component_evictable_size(self, component_type: ComponentType) -> int:
        if component_type == FULL:
            return self._native.sizes()[0]
        if component_type == MAMBA:
            return self._native.mamba_sizes()[0]
        return self._native.swa_sizes()[0] if component_type == SWA else 0

    def component_protected_size(self, component_type: ComponentType) -> int:
        if component_type == FULL:
            return self._native.sizes()[1]
        if component_type == MAMBA:
            return self._native.mamba_sizes()[1]
        return self._native.swa_sizes()[1] if component_type == SWA else 0

    def adjust_component_size(self, node_id: NodeId, component_type: ComponentType, delta: int) -> None:
        self._native.node_info(node_id)  # KeyError for a missing node, as SGLang's
        raise ValueError(
            f"adjust_component_size: component {component_type!r}: FULL values are backed one "
            "to one by pool rows in this tree core; there is nothing to adjust"
        )

    def full_evictable_size(self) -> int:
        return self._native.sizes()[0]

    def full_protected_size(self) -> int:
        return self._native.sizes()[1]

    def swa_evictable_size(self) -> int:
        return self._native.swa_sizes()[0]

    def mamba_evictable_size(self) -> int:
        return self._native.mamba_sizes()[0]

    def swa_protected_size(self) -> int:
        return self._native.swa_sizes()[1]

    def mamba_protected_size(self) -> int:
        return self._native.mamba_sizes()[1]

    def total_size(self) -> tuple[int, int]:
        e, p = self._native.sizes()
        se, sp = self._native.swa_sizes()
        me, mp = self._native.mamba_sizes()
        return e + p, se + sp + me + mp

    def all_values_flatten(self) -> torch.Tensor:
        native = self._native
        values = [native.value(n) for n in native.dfs() if n != self._root]
        values = [v for v in values if v is not None]
        if not values:
            return self._empty_device
        return self._tensor(bytearray(b"".join(values)))

    def all_mamba_values_flatten(self) -> torch.Tensor:
        native = self._native
        values = [native.mamba_value(n) for n in native.dfs()] if self._mamba else []
        values = [v for v in values if v is not None]
        if not values:
            return self._empty_device
        return self._mtensor(bytearray(b"".join(values)))

    def walk_for_kv_canary(self, unlocked_only: bool, swa_resident_only: bool) -> RadixCacheWalkResult:
        native = self._native
        slots: list[int] = []
        positions: list[int] = []
        prev_slots: list[int] = []
        stack = [(self._root, 0, -1)]
        while stack:
            node, depth, parent_last = stack.pop()
            _, key_len, _, lock_ref, _, _, _ = native.node_info(node)
            raw = native.value(node)
            node_slots = torch.frombuffer(raw, dtype=torch.int64).tolist() if raw else []
            emit = node != self._root and (not unlocked_only or lock_ref == 0)
            if emit and swa_resident_only and self._swa and self._native.swa_info(node)[0] < 0:
                emit = False
            last = parent_last
            for j, slot in enumerate(node_slots):
                if emit:
                    slots.append(slot)
                    positions.append(depth + j)
                    prev_slots.append(parent_last if j == 0 else node_slots[j - 1])
                last = slot
            child_depth = depth + (len(node_slots) if node == self._root else key_len)
            for child in reversed(native.children(node)):
                stack.append((child, child_depth, last))
        return RadixCacheWalkResult(
            slot_indices=torch.tensor(slots, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            prev_slot_indices=torch.tensor(prev_slots, dtype=torch.int64),
        )

    # ==== match ====

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        key = params.key
        if len(key) < self.page_size:
            return self._empty_match_result
        if key.is_bigram:
            self._bigram(key)
        # The key's own buffer and its limit: no copy of a capped key.
        n, node, hit, last = self._native.match_prefix(self._ns_of(key), key.token_ids, key.limit)
        branching = mamba_branching = None
        if self._swa:
            # SGLang's SWA finalize: FULL KV past the last reusable window.
            aligned = hit // self.page_size * self.page_size
            branching = aligned if aligned > n else None
        if self._mamba:
            # SGLang's Mamba finalize: FULL KV past the last reusable state, on the
            # checkpoint grid.
            grid = self._grid()
            aligned = hit // grid * grid
            mamba_branching = aligned if aligned > n else None
        return _match_result(n, node, hit, None if last < 0 else last, branching, mamba_branching)

    def match_full_device_prefix(self, key) -> tuple[int, NodeId, int]:
        if key.is_bigram:
            self._bigram(key)
        return tuple(self._native.match_full_device_prefix(self._ns_of(key), key.token_ids, key.limit))

    @property
    def empty_match_result(self) -> MatchResult:
        return self._empty_match_result

    def supports_fast_match_prefix(self) -> bool:
        # As SGLang's own cores answer: True would make the scheduler match every waiting
        # request each round (splitting nodes, stamping them) and keep LPM on long queues,
        # so the same requests would be served differently than on SGLang's cores.
        return False

    def is_full_device_evicted(self, node_id: NodeId) -> bool:
        return self._native.is_evicted(node_id)

    def collect_full_device_indices(self, from_node_id: NodeId, until_node_id: NodeId) -> torch.Tensor:
        if from_node_id == until_node_id:
            return self._empty_device
        return self._tensor(self._native.collect_indices(from_node_id, until_node_id))

    # ==== insert (every FULL action is deferrable: one step) ====

    def begin_insert(self, params: InsertParams) -> InsertStepResult:
        if self._ongoing_insert:
            raise RuntimeError("concurrent insert walks")
        if params.rotation_base is not None:
            raise ValueError("insert: rotation_base is set, but this tree core does not track rotation bases")
        key = params.key
        value = params.value
        if value is not None and not (self._cpu and value.is_cpu):
            value = value.cpu()
        if key.is_bigram:
            self._bigram(key)
        total = len(key) // self.page_size * self.page_size
        # Checked before anything changes (SGLang asserts it in the commit).
        state = self._mamba_state(params.mamba_value) if self._mamba and total else None
        if self._swa:
            return self._begin_insert_swa(params, key, value, total, state)
        self._ongoing_insert = True
        try:
            prefix_len, node, dups = self._native.insert(
                self._ns_of(key), key.token_ids, value, params.prev_prefix_len, key.limit
            )
        finally:
            self._ongoing_insert = False
        adopted = None
        if params.track_adopted_ranges:
            adopted = {FULL: [(prefix_len, total)]} if total > prefix_len else {}
        result = InsertResult(
            prefix_len=prefix_len,
            last_device_node=node,
            mamba_exist=total == 0,
            adopted_ranges=adopted,
        )
        actions = [FreeDeviceKV([self._tensor(dups)])] if dups is not None else []
        return self._commit_mamba(node, prefix_len < total, state, result, actions, refreshed=True)

    def _commit_mamba(self, node, new_leaf, state, result, actions, refreshed) -> InsertStepResult:
        """SGLang's Mamba commit (after FULL's and SWA's), then the insert's end: at once,
        or at a barrier (an SWARebuild, the path cap's MambaEvictExcessPathStates) after
        which the cache resumes it."""
        barrier = not refreshed
        if state is not None:
            result.mamba_exist = self._native.mamba_commit(node, new_leaf, state)
            if not result.mamba_exist and self._mamba_cap() >= 0:
                actions.append(MambaEvictExcessPathStates(node))
                barrier = True
        if not barrier:
            return InsertStepResult(actions=actions, result=result)
        self._pending_insert = (node, result, refreshed)
        self._ongoing_insert = True
        return InsertStepResult(actions=actions)

    def _begin_insert_swa(self, params: InsertParams, key, value, total, state) -> InsertStepResult:
        if params.track_adopted_ranges:
            raise ValueError("insert: track_adopted_ranges is not in the radixkv tree core's SWA insert yet")
        swa_start = params.get_evicted_seqlen(SWA)
        prefix_len, node, raw, refreshed = self._native.insert_swa(
            self._ns_of(key), key.token_ids, value, params.prev_prefix_len, swa_start, key.limit
        )
        actions = []
        for kind, nid, a, b in raw:
            if kind == 0:
                actions.append(FreeDeviceKV([self._tensor(a)]))
            elif kind == 1:
                actions.append(FreeDeviceKVFullOnly([self._tensor(a)]))
            elif kind == 2:
                actions.append(SWARebuild(nid, self._tensor(a)))
            else:
                actions.append(RecoverSWAWithLockedFull(nid, self._tensor(a), self._tensor(b)))
        result = InsertResult(
            prefix_len=prefix_len, last_device_node=node, mamba_exist=total == 0, adopted_ranges=None
        )
        branching = params.swa_branching_seqlen
        if branching is not None:
            result.swa_branch_inserted = len(key) >= branching
        # Not refreshed: a barrier (SGLang's SWARebuild): the cache stores the SWA values,
        # then resumes, and the window refresh that ends the insert runs then.
        return self._commit_mamba(node, prefix_len < total, state, result, actions, refreshed)

    def resume_insert(self) -> InsertStepResult:
        if self._pending_insert is None:
            raise RuntimeError("no in-flight insert")
        node, result, refreshed = self._pending_insert
        self._pending_insert = None
        self._ongoing_insert = False
        if self._swa and not refreshed and not self._native.is_root(node):
            self._native.swa_refresh(node)
        return InsertStepResult(actions=[], result=result)

    def has_ongoing_insert(self) -> bool:
        return self._ongoing_insert

    def end_insert(self) -> list:
        self._ongoing_insert = False
        self._pending_insert = None
        return []

    # ==== host tier: none in this slice ====

    def drive_host_eviction(self, component_type: ComponentType, num_tokens: int) -> DriveHostEvictionResult:
        return DriveHostEvictionResult()  # no host values to evict

    def evict_excess_path_states(self, tail_node_id, device_frees, host_frees, cache_actions) -> None:
        if not self._mamba:
            raise ValueError("evict_excess_path_states: no Mamba component in this tree core")
        cap = self._mamba_cap()
        if cap < 0:
            self._native.node_info(tail_node_id)  # KeyError for a missing node
            return None  # no cap
        for state in self._native.mamba_evict_excess(tail_node_id, cap):
            device_frees[MAMBA].append(self._mtensor(state))

    def insert_host(self, node_id, key, host_value, hash_value):
        raise _no_host("insert_host")

    def build_backup_spec(self, node_id):
        raise _no_host("build_backup_spec")

    def build_storage_backup_spec(self, node_id, pass_prefix_keys):
        raise _no_host("build_storage_backup_spec")

    def build_hicache_transfers(self, component_type, node_id, phase, **kwargs):
        raise _no_host("build_hicache_transfers")

    def build_load_back_spec(self, node_id, req=None):
        raise _no_host("build_load_back_spec")

    def prefetch_anchor_info(self, node_id: NodeId) -> tuple[Optional[str], Optional[str]]:
        ns = self._native.node_info(node_id)[6]
        return self._ns_names[ns]

    def commit_hicache_transfers(self, node_id, phase, comp_xfers, *, cache_actions, insert_result=None, pool_storage_result=None):
        raise _no_host("commit_hicache_transfers")

    def commit_backup(self, node_id, host_indices, comp_xfers):
        raise _no_host("commit_backup")

    def commit_load_back(self, node_id, device_indices, kv_xfer, comp_xfers):
        raise _no_host("commit_load_back")

    def finish_load_back(self, anchor_node_id: NodeId) -> None:
        raise _no_host("finish_load_back")

    def build_external_linker_offload_transfers(self, node_id):
        raise _no_host("build_external_linker_offload_transfers")

    def mark_external_cache_stored_path(self, from_node_id, until_node_id):
        raise _no_host("mark_external_cache_stored_path")

    def mark_external_linker_offload_pending(self, node_id):
        raise _no_host("mark_external_linker_offload_pending")

    def finish_external_linker_offload(self, node_ids, ack_id, success):
        raise _no_host("finish_external_linker_offload")

    def mark_write_through_pending(self, node_ids, ack_id):
        raise _no_host("mark_write_through_pending")

    def finish_write_through(self, node_ids, ack_id):
        raise _no_host("finish_write_through")

    # ==== the auxiliary components' values ====

    def swa_tombstone_ranges(self, key, start, end, component_type=ComponentType.SWA):
        self._check_component(component_type, "swa_tombstone_ranges")
        if component_type != SWA:
            raise ValueError("swa_tombstone_ranges: component FULL has no tombstones")
        if key.is_bigram:
            self._bigram(key)
        return [tuple(r) for r in self._native.swa_tombstone_ranges(self._ns_of(key), key.token_ids, start, end)]

    def attach_swa_window(self, key, window_start, window_end, swa_values, component_type=ComponentType.SWA):
        self._check_component(component_type, "attach_swa_window")
        if component_type != SWA:
            raise ValueError("attach_swa_window: component FULL is not an SWA component")
        if key.is_bigram:
            self._bigram(key)
        values = swa_values.detach().to("cpu", torch.int64).contiguous().numpy()
        self._native.attach_swa_window(self._ns_of(key), key.token_ids, window_start, window_end, values)
        return []  # a split emits UpdatePendingBackupOnNodeSplit only with a host tier

    def set_component_device_value(self, node_id, component_type, value) -> None:
        self._native.node_info(node_id)
        if component_type == SWA and self._swa:
            self._native.swa_set_value(node_id, value.detach().to("cpu", torch.int64).contiguous().numpy())
            return
        if component_type == MAMBA and self._mamba:
            if value is None or value.dim() != 1:
                raise ValueError(
                    f"set_component_device_value: a Mamba state is a 1-D tensor, got {value!r}; nothing was changed"
                )
            state = value.detach().to("cpu", torch.int64).contiguous().numpy()
            self._native.mamba_set_value(node_id, state)
            self._mamba_dtype = value.dtype
            return
        raise ValueError(
            f"set_component_device_value: component {component_type!r} is not an auxiliary "
            "component of this tree core"
        )

    def get_component_device_value(self, node_id, component_type) -> Optional[torch.Tensor]:
        if component_type == SWA and self._swa:
            raw = self._native.swa_value(node_id)
        elif component_type == MAMBA and self._mamba:
            raw = self._native.mamba_value(node_id)
            return None if raw is None else self._mtensor(raw)
        elif component_type == FULL:
            raw = self._native.value(node_id)
        else:
            self._native.node_info(node_id)
            raw = None
        return None if raw is None else self._tensor(raw)

    def component_has_host_value_only(self, node_id, component_type) -> bool:
        self._native.node_info(node_id)
        return False

    # ==== others ====

    def sanity_check(self, ongoing_write_through, ongoing_load_back) -> None:
        problem = self._native.check()
        assert problem is None, f"radixkv tree core: {problem}"

    def pretty_print(self) -> None:
        native = self._native
        stack = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            _, key_len, vlen, lock_ref, _, _, _ = native.node_info(node)
            print(" " * depth, f"node {node}: {key_len} tokens, value {vlen}, lock_ref {lock_ref}")
            for c in reversed(native.children(node)):
                stack.append((c, depth + 2))
        e, p = native.sizes()
        print(f"#tokens: {e + p} (evictable {e}, protected {p})")


# ---- construction, with the fallback ---------------------------------------------------

import logging  # noqa: E402

logger = logging.getLogger("radixkv.sglang")


def create(params, components, inspector: bool = False):
    """The tree core for ``params``: radixkv's, or -- for a configuration this slice cannot
    run -- SGLang's Python ``UnifiedTreeCore``, with a warning saying why. ``inspector``:
    the test kit's white-box variants of both."""
    reason = unsupported_reason(params)
    if reason is not None:
        logger.warning("radixkv tree core: using SGLang's Python UnifiedTreeCore instead: %s", reason)
        if inspector:
            from sglang.test.kits.unified_radix_cache.unified_tree_core_inspector import UnifiedTreeCoreInspector

            return UnifiedTreeCoreInspector(params, components)
        from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

        return UnifiedTreeCore(params, components)
    if inspector:
        from ._sglang_tree_core_inspector import RadixKvTreeCoreInspector

        return RadixKvTreeCoreInspector(params, components)
    return RadixKvTreeCore(params, components)
