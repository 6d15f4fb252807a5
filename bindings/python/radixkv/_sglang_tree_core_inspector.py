"""``RadixKvTreeCoreInspector``: the white-box methods of SGLang's test kit
(``sglang.test.kits.unified_radix_cache``'s ``UnifiedTreeCoreInspectionInterface``) over
``RadixKvTreeCore``, for SGLang's shared unified-cache tests. Test-only, as SGLang keeps its
own inspectors: the production class (``radixkv._sglang_tree_core.RadixKvTreeCore``) has
none of these methods. Read-only probes are answered from the native tree; the probes that
write SGLang's Python node state directly (``set_*_raw``, ``set_component_*_size``, ...)
raise ``NotImplementedError``: the native tree has no such state to poke.
"""

from __future__ import annotations

from typing import Optional

import torch
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.test.kits.unified_radix_cache.unified_tree_core_inspection_interface import (
    UnifiedTreeCoreInspectionInterface,
)

from ._sglang_tree_core import FULL, MAMBA, RadixKvTreeCore


def _white_box(what: str) -> NotImplementedError:
    return NotImplementedError(f"{what}: writes SGLang's Python node state, which the radixkv tree core does not have")


class RadixKvTreeCoreInspector(RadixKvTreeCore, UnifiedTreeCoreInspectionInterface):
    """Test-only inspection adapter (see the module docs)."""

    def contains_node(self, node_id) -> bool:
        try:
            self._native.node_info(node_id)
        except KeyError:
            return False
        return True

    def get_parent_node_id(self, node_id) -> Optional[int]:
        parent = self._native.node_info(node_id)[0]
        return None if parent < 0 else parent

    def get_child_node_ids(self, node_id) -> list[int]:
        return list(self._native.children(node_id))

    def get_node_key_length(self, node_id) -> int:
        return self._native.node_info(node_id)[1]

    def get_node_token_ids(self, node_id) -> list[int]:
        return torch.frombuffer(self._native.key(node_id), dtype=torch.int64).tolist() if self.get_node_key_length(node_id) else []

    def is_node_key_bigram(self, node_id) -> bool:
        self._native.node_info(node_id)
        return False

    def get_component_host_value(self, node_id, component_type) -> Optional[torch.Tensor]:
        self._native.node_info(node_id)
        return None

    def get_component_device_lock_ref(self, node_id, component_type) -> int:
        info = self._native.node_info(node_id)
        if component_type == ComponentType.SWA and self._swa:
            return self._native.swa_info(node_id)[1]
        if component_type == MAMBA and self._mamba:
            return self._native.mamba_info(node_id)[1]
        return info[3] if component_type == FULL else 0

    def get_component_host_lock_ref(self, node_id, component_type) -> int:
        self._native.node_info(node_id)
        return 0

    def get_node_hit_count(self, node_id) -> int:
        self._native.node_info(node_id)
        return 0  # counted only for write-through backups, which need the host tier

    def get_write_through_pending_id(self, node_id) -> Optional[int]:
        self._native.node_info(node_id)
        return None

    def is_external_cache_stored(self, node_id) -> bool:
        self._native.node_info(node_id)
        return False

    def is_node_in_device_lru(self, node_id, component_type) -> bool:
        if component_type == ComponentType.SWA and self._swa:
            return self._native.swa_info(node_id)[3]
        if component_type == MAMBA and self._mamba:
            return self._native.mamba_info(node_id)[2]
        if component_type != FULL:
            return False
        return not self.is_root(node_id) and not self.is_full_device_evicted(node_id)

    def is_node_in_host_lru(self, node_id, component_type) -> bool:
        self._native.node_info(node_id)
        return False

    def get_component_device_lru_node_ids(self, component_type) -> list[int]:
        if component_type == ComponentType.SWA and self._swa:
            return list(self._native.swa_lru())  # most recent first, as SGLang's
        if component_type == MAMBA and self._mamba:
            return list(self._native.mamba_lru())
        if component_type != FULL:
            return []
        nodes = [n for n in self._native.dfs() if n != self._root and not self.is_full_device_evicted(n)]
        # Most recently used first.
        return sorted(nodes, key=lambda n: -self._native.node_info(n)[5])

    def is_device_evictable_leaf(self, node_id) -> bool:
        parent, _, vlen, lock_ref, _, _, _ = self._native.node_info(node_id)
        if parent < 0 or vlen < 0 or lock_ref > 0:
            return False
        if self._swa and self._native.swa_info(node_id)[1] > 0:  # a window lock pins it too
            return False
        if self._mamba and self._native.mamba_info(node_id)[1] > 0:  # so does a Mamba lock
            return False
        return all(self._native.node_info(c)[2] < 0 for c in self._native.children(node_id))

    def is_host_evictable_leaf(self, node_id) -> bool:
        self._native.node_info(node_id)
        return False

    def is_device_leaf(self, node_id) -> bool:
        parent, _, vlen, _, _, _, _ = self._native.node_info(node_id)
        if parent < 0 or vlen < 0:
            return False
        return all(self._native.node_info(c)[2] < 0 for c in self._native.children(node_id))

    def get_all_node_ids(self) -> list[int]:
        return list(self._native.dfs())

    def component_protected_size(self, component_type: ComponentType) -> int:
        return RadixKvTreeCore.component_protected_size(self, component_type)

    def set_node_hash_values(self, *args, **kwargs):
        raise _white_box("set_node_hash_values")

    def set_component_device_value_raw(self, *args, **kwargs):
        raise _white_box("set_component_device_value_raw")

    def set_component_host_value_raw(self, *args, **kwargs):
        raise _white_box("set_component_host_value_raw")

    def set_component_device_lock_ref(self, *args, **kwargs):
        raise _white_box("set_component_device_lock_ref")

    def remove_node_from_device_lru(self, *args, **kwargs):
        raise _white_box("remove_node_from_device_lru")

    def insert_node_into_host_lru(self, *args, **kwargs):
        raise _white_box("insert_node_into_host_lru")

    def set_component_evictable_size(self, *args, **kwargs):
        raise _white_box("set_component_evictable_size")

    def set_component_protected_size(self, *args, **kwargs):
        raise _white_box("set_component_protected_size")

    def update_duplicate_tracking(self, node_id) -> None:
        self._native.node_info(node_id)  # no host duplicates without a host tier

    def advance_insert_walk_once(self) -> None:
        raise RuntimeError("no in-flight insert (the radixkv tree core's FULL insert runs in one step)")

    def evict_component(self, *args, **kwargs):
        raise _white_box("evict_component")

    def validate_cascade_evict(self, *args, **kwargs):
        raise _white_box("validate_cascade_evict")

    def cleanup_tombstone_ancestors(self, *args, **kwargs):
        raise _white_box("cleanup_tombstone_ancestors")

    def finalize_component_match_result(self, *args, **kwargs):
        raise _white_box("finalize_component_match_result")

    def build_backup_node_ids(self, *args, **kwargs):
        raise NotImplementedError("build_backup_node_ids: the radixkv tree core keeps no host tier")
