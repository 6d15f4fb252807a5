"""Bundles the radixkv shared library into the package at build time, so that
`pip install bindings/python` after `cargo build --release` gives a package that works
from anywhere. The library is taken from $RADIXKV_LIB, else ../../target/release/.
Without one, the package installs anyway and looks for the library at import time
(see radixkv/_native.py)."""

import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

if sys.platform == "darwin":
    LIB_NAME = "libradixkv.dylib"
elif sys.platform == "win32":
    LIB_NAME = "radixkv.dll"
else:
    LIB_NAME = "libradixkv.so"


def find_library():
    env = os.environ.get("RADIXKV_LIB")
    if env:
        p = Path(env)
        p = p / LIB_NAME if p.is_dir() else p
        if not p.is_file():
            raise SystemExit(f"RADIXKV_LIB={env}: no such library")
        return p
    p = Path(__file__).resolve().parent.parent.parent / "target" / "release" / LIB_NAME
    return p if p.is_file() else None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = find_library()
        if lib is None:
            print("radixkv: no shared library found to bundle; set RADIXKV_LIB at run time")
            return
        dest = Path(self.build_lib) / "radixkv" / LIB_NAME
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lib, dest)
        print(f"radixkv: bundled {lib}")


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
