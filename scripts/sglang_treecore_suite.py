"""The runs behind scripts/sglang-treecore-check, one backend per process.

    python scripts/sglang_treecore_suite.py tests BACKEND TEST_FILE OUT_JSON
        One of SGLang's unified-cache test files (test/registered/unit/mem_cache/...) with
        its caches on the tree core BACKEND (python, rust or radixkv): the kit's
        ``TREE_CORE_TEST_BACKEND`` (and a test file's own ``_TREE_CORE_TEST_BACKEND``) set
        to it, as SGLang's own re-runs set them; ``radixkv`` through
        ``radixkv.sglang.tree_core_inspector_factory`` (the kit builds every cache through
        an inspector: its own for python and rust). The kit's ``get_device`` answers "cpu"
        on a machine without an accelerator (it raises there). No assertion is touched.
        Writes each test's outcome as scripts/sglang_check_suite.py does.

    python scripts/sglang_treecore_suite.py replay OUT_JSON
        The differential: for each of the kit's [FULL] configs (its CONFIGS), seeded
        workloads through UnifiedRadixCache with the scheduler's loop (match, lock, evict
        when short, insert with prev_prefix_len, unlock) on SGLang's python and rust cores
        and on radixkv, every step's prefix length, evicted tokens, insert prefix, sizes
        and free pool recorded; the same for each of the kit's [FULL, SWA] configs with
        SWA's own pressure (tests/test_sglang_tree_core.py's _replay_swa: valid matches,
        branching points, both walks' evictions, SWA sizes, both free pools); the same for
        each of the kit's Mamba configs ([FULL, MAMBA], [FULL, SWA, MAMBA]) with a starved
        Mamba pool and requests in flight (tests/test_sglang_tree_core.py's _replay_mamba:
        Mamba branching points, mamba_exist, the Mamba walk's leaves and tombstones, Mamba
        sizes and free slots, all_mamba_values_flatten); and for each of the kit's other
        configs (none in 0.5.23's kit), what the radixkv core does with it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import random
import sys
import unittest
import warnings
from array import array
from unittest import mock

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_cache.tree_core_registry import _TREE_CORE_REGISTRY  # noqa: E402
from sglang.test.kits.unified_radix_cache import config as kit_config  # noqa: E402
from sglang.test.kits.unified_radix_cache import fixtures as kit  # noqa: E402

import radixkv.sglang as rs  # noqa: E402

BACKENDS = ("python", "rust", "radixkv")


def _cpu(*_a, **_k):
    return "cpu"


def _on_cpu_without_accelerator():
    """The kit's ``get_device`` raises without an accelerator; on such a machine it answers
    "cpu" (the pools and allocators then live on the CPU)."""
    try:
        kit.get_device()
    except RuntimeError:
        kit.get_device = _cpu
        return True
    return False


def run_tests(backend, path, out):
    from sglang_check_suite import Recorder, _flatten

    cpu = _on_cpu_without_accelerator()
    kit.TREE_CORE_TEST_BACKEND = backend
    _TREE_CORE_REGISTRY["radixkv"] = rs.tree_core_inspector_factory
    spec = importlib.util.spec_from_file_location("sglang_unified_cache_tests", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(mod)
    if hasattr(mod, "_TREE_CORE_TEST_BACKEND"):
        mod._TREE_CORE_TEST_BACKEND = backend
    if cpu and hasattr(mod, "get_device"):
        mod.get_device = _cpu
    suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
    names = [f"{type(t).__name__}.{t._testMethodName}" for t in _flatten(suite)]
    runner = unittest.TextTestRunner(resultclass=Recorder, verbosity=0, stream=sys.stderr)
    result = runner.run(suite)
    outcome = {n: [result.outcome.get(n, "passed"), result.why.get(n, "")] for n in names}
    with open(out, "w") as f:
        json.dump(outcome, f, indent=1, sort_keys=True)


# ---- the differential -------------------------------------------------------------------


def build(cfg, backend, mamba_chunk=None):
    """A kit cache on ``backend``. The replay reads no white-box state, so SGLang's Rust core
    runs as its production class: the wheel ships no inspection build of it (the kit's
    ``RustUnifiedTreeCoreInspector`` builds one from SGLang's sources)."""
    import types

    from sglang.srt.mem_cache.rust_tree_core.adapter import RustUnifiedTreeCore

    fake = types.ModuleType("rust_unified_tree_core_inspector")
    fake.RustUnifiedTreeCoreInspector = RustUnifiedTreeCore
    with mock.patch.dict(_TREE_CORE_REGISTRY, {"radixkv": rs.tree_core_inspector_factory}), mock.patch.dict(
        sys.modules, {"sglang.test.kits.unified_radix_cache.rust_unified_tree_core_inspector": fake}
    ), mock.patch.object(kit, "UnifiedTreeCoreInspectionInterface", object):
        cache, alloc, _ = kit.build_fixture(cfg, tree_core_backend=backend, mamba_cache_chunk_size=mamba_chunk)
    return cache, alloc


def workload(seed, n, page_size):
    rng = random.Random(seed)
    stems = [[rng.randrange(1, 60) for _ in range(rng.randrange(1, 6) * page_size)] for _ in range(5)]
    history, out = [], []
    for _ in range(n):
        if history and rng.random() < 0.6:
            base = list(rng.choice(history))[: rng.randrange(0, 1 + len(history[-1]))]
        else:
            base = list(rng.choice(stems))
        toks = base + [rng.randrange(1, 60) for _ in range(rng.randrange(1, 5 * page_size))]
        history.append(toks)
        out.append(toks)
    return out


def replay(cache, alloc, reqs):
    steps = []
    for toks in reqs:
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", toks))))
        n = m.device_prefix_len
        lock = cache.lock(m.last_device_node)
        prefix = cache.tree_core.collect_full_device_indices(m.last_device_node, cache.root_node_handle()) if n else None
        need = len(toks) - n
        evicted = 0
        if alloc.available_size() < need:
            evicted = cache.evict(EvictParams(num_tokens=need - alloc.available_size())).num_tokens_evicted
        new = alloc.alloc(need)
        if new is None:
            cache.unlock(lock)
            steps.append([n, evicted, None])
            continue
        value = torch.cat([prefix[:n], new]) if n else new
        res = cache.insert(InsertParams(key=RadixKey(array("q", toks)), value=value, prev_prefix_len=n))
        aligned = len(toks) // cache.page_size * cache.page_size
        if aligned < len(toks):
            alloc.free(value[aligned:])
        cache.unlock(lock)
        steps.append([n, evicted, res.prefix_len, cache.evictable_size(), cache.protected_size(), alloc.available_size()])
    cache.tree_core.sanity_check([], [])
    return steps


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _swa_replay():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python", "tests")
    sys.path.insert(0, here)
    from test_sglang_tree_core import _replay_swa, _workload

    return _replay_swa, _workload


def _mamba_replay():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python", "tests")
    sys.path.insert(0, here)
    from test_sglang_tree_core import _mamba_workload, _replay_mamba

    return _replay_mamba, _mamba_workload


def _compare(row, got, seed, evicted_of, trailing=0):
    """Folds one seed's runs into ``row``: steps, hit tokens, evictions per backend, and
    whether each is python's (every step and the ``trailing`` end-of-run entries)."""
    for b in BACKENDS:
        r = row.setdefault(b, {"steps": 0, "hits": 0, "evicted": 0, "same_as_python": True})
        steps = [s for s in got[b][: len(got[b]) - trailing] if isinstance(s, list)]
        r["steps"] += len(steps)
        r["hits"] += sum(s[0] for s in steps)
        r["evicted"] += sum(evicted_of(s) for s in steps)
        if got[b] != got["python"]:
            r["same_as_python"] = False
            first = next((i for i, (x, y) in enumerate(zip(got[b], got["python"])) if x != y), 0)
            r.setdefault("first_difference", f"seed {seed} step {first}: {got[b][first]} vs python {got['python'][first]}")


def run_replay(out):
    _on_cpu_without_accelerator()
    report = {"full": {}, "other": {}}
    for cfg in kit_config.CONFIGS:
        if ComponentType.MAMBA in cfg.components and not cfg.is_eagle:
            replay_mamba, mamba_workload = _mamba_replay()
            window = cfg.sliding_window_size if ComponentType.SWA in cfg.components else None
            cfg = kit_config.CacheConfig(**{**cfg.__dict__, "kv_size": min(cfg.kv_size, 24 * cfg.page_size)})
            row = {}
            for seed in range(3):
                reqs = mamba_workload(seed, 150, cfg.page_size)
                got = {}
                for b in BACKENDS:
                    try:
                        cache, alloc = build(cfg, b, mamba_chunk=2 * cfg.page_size)
                        got[b] = [list(s) for s in replay_mamba(cache, alloc, reqs, 4, window)]
                    except Exception as e:  # noqa: BLE001 - reported, never hidden
                        got[b] = [f"{type(e).__name__}: {e}"]

                def evicted_of(s):  # FULL (and SWA) tokens evicted for KV, Mamba states for a slot
                    return sum(s[3] or ()) + sum(s[4] or ()) if len(s) > 4 else sum(s[1] or ())

                _compare(row, got, seed, evicted_of, trailing=3)
            report["full"][cfg.label] = row
        elif cfg.components == (ComponentType.FULL, ComponentType.SWA) and not cfg.is_eagle:
            replay_swa, swa_workload = _swa_replay()
            cfg = kit_config.CacheConfig(**{**cfg.__dict__, "kv_size": min(cfg.kv_size, 24 * cfg.page_size)})
            row = {}
            for seed in range(3):
                reqs = swa_workload(seed, 150, cfg.page_size)
                got = {}
                for b in BACKENDS:
                    try:
                        got[b] = [list(s) for s in replay_swa(*build(cfg, b), reqs, cfg.sliding_window_size)]
                    except Exception as e:  # noqa: BLE001 - reported, never hidden
                        got[b] = [f"{type(e).__name__}: {e}"]
                for b in BACKENDS:
                    r = row.setdefault(b, {"steps": 0, "hits": 0, "evicted": 0, "same_as_python": True})
                    r["steps"] += len(got[b])
                    r["hits"] += sum(s[0] for s in got[b] if isinstance(s, list))
                    r["evicted"] += sum(sum(s[3]) for s in got[b] if isinstance(s, list) and len(s) > 3 and s[3])
                    if got[b] != got["python"]:
                        r["same_as_python"] = False
                        first = next((i for i, (x, y) in enumerate(zip(got[b], got["python"])) if x != y), 0)
                        r.setdefault("first_difference", f"seed {seed} step {first}: {got[b][first]} vs python {got['python'][first]}")
            report["full"][cfg.label] = row
        elif cfg.components == (ComponentType.FULL,) and not cfg.is_eagle:
            cfg = kit_config.CacheConfig(**{**cfg.__dict__, "kv_size": 256})
            row = {}
            for seed in range(4):
                reqs = workload(seed, 200, cfg.page_size)
                got = {b: replay(*build(cfg, b), reqs) for b in BACKENDS}
                for b in BACKENDS:
                    r = row.setdefault(b, {"steps": 0, "hits": 0, "evicted": 0, "same_as_python": True})
                    r["steps"] += len(got[b])
                    r["hits"] += sum(s[0] for s in got[b])
                    r["evicted"] += sum(s[1] for s in got[b])
                    if got[b] != got["python"]:
                        r["same_as_python"] = False
                        first = next(i for i, (x, y) in enumerate(zip(got[b], got["python"])) if x != y)
                        r.setdefault("first_difference", f"seed {seed} step {first}: {got[b][first]} vs python {got['python'][first]}")
            report["full"][cfg.label] = row
        else:
            handler = _Warnings()
            logging.getLogger("radixkv.sglang").addHandler(handler)
            try:
                cache, _ = build(cfg, "radixkv")
                core = type(cache.tree_core).__name__
                err = None
            except Exception as e:  # noqa: BLE001 - reported, never hidden
                core, err = None, f"{type(e).__name__}: {e}"
            finally:
                logging.getLogger("radixkv.sglang").removeHandler(handler)
            report["other"][cfg.label] = {"core": core, "warning": handler.lines[:1], "error": err}
    with open(out, "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    if sys.argv[1] == "tests":
        run_tests(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "replay":
        run_replay(sys.argv[2])
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}")
