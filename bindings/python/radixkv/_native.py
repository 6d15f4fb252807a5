"""Loading the native extension, ``radixkv._radixkv`` (PyO3, over radixkv's Rust API).

The extension is the one installed with the package, unless the environment variable
``RADIXKV_LIB`` names another build of it (a file, or a directory holding
``_radixkv*.so``/``.pyd``), e.g. a development build: then that one is loaded, and a
missing one is an ``ImportError`` naming ``RADIXKV_LIB``.

``lib`` keeps three calls of the C ABI's names for code (and tests) that used them with the
ctypes bindings this package had before: ``rkv_status_str(status) -> bytes``,
``rkv_last_error_message() -> bytes`` (this thread's message for its last failed call,
``b""`` after a success) and ``rkv_release(cache, handle) -> int`` (a status: 0, or 3 for an
invalid lock; ``cache`` is a ``Cache``'s ``_ptr``). The C ABI itself is for C and C++.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ABI_VERSION = 1
_NAME = "radixkv._radixkv"


def _load() -> ModuleType:
    env = os.environ.get("RADIXKV_LIB")
    if not env:
        from . import _radixkv  # the installed build

        return _radixkv
    p = Path(env)
    if p.is_dir():
        found = [
            c
            for suffix in importlib.machinery.EXTENSION_SUFFIXES
            for c in sorted(p.glob("_radixkv" + suffix))
        ]
        if not found:
            raise ImportError(f"RADIXKV_LIB={env}: no _radixkv extension module in that directory")
        p = found[0]
    elif not p.is_file():
        raise ImportError(f"RADIXKV_LIB={env}: no such file")
    spec = importlib.util.spec_from_file_location(_NAME, str(p))
    if spec is None or spec.loader is None:
        raise ImportError(f"RADIXKV_LIB={env}: not an extension module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = mod
    spec.loader.exec_module(mod)
    return mod


ext = _load()
#: The path of the loaded extension module.
lib_path = Path(ext.__file__).resolve()


class _Lib:
    """The C ABI's names for a few calls (see the module docs)."""

    @staticmethod
    def rkv_status_str(status: int) -> bytes:
        return ext.status_str(int(status)).encode()

    @staticmethod
    def rkv_last_error_message() -> bytes:
        return ext.last_error_message().encode()

    @staticmethod
    def rkv_release(cache: Any, handle: int) -> int:
        return cache.release_status(int(handle))

    @staticmethod
    def rkv_version() -> bytes:
        return ext.version().encode()

    @staticmethod
    def rkv_abi_version() -> int:
        return ABI_VERSION


lib = _Lib()
