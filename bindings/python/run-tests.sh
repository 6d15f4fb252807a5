#!/usr/bin/env bash
# Installs bindings/python into a fresh virtual environment (bundling the shared library
# of the given cargo profile) and runs its pytest suite against the installed package.
#
#   cargo build [--release]
#   bindings/python/run-tests.sh [PROFILE_DIR]   # default: target/release, else target/debug
#
# Needs python3 with venv, and pytest (numpy optional) importable by python3: the venv is
# made with --system-site-packages. `pip install` uses build isolation (fetches
# setuptools) unless setuptools and wheel are installed already. Environment: PYTHON
# (default python3); RADIXKV_PY_NO_INSTALL=1 skips the install and tests the sources in
# place (for offline machines without setuptools+wheel). Prints "N passed, M failed"
# last; exits non-zero on any failure.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PROFILE_DIR="${1:-}"
if [ -z "$PROFILE_DIR" ]; then
  if [ -f "$ROOT/target/release/libradixkv.so" ]; then PROFILE_DIR=target/release; else PROFILE_DIR=target/debug; fi
fi
case "$PROFILE_DIR" in /*) ;; *) PROFILE_DIR="$ROOT/$PROFILE_DIR" ;; esac
PYTHON="${PYTHON:-python3}"
LIB="$PROFILE_DIR/libradixkv.so"
[ "$(uname)" = Darwin ] && LIB="$PROFILE_DIR/libradixkv.dylib"
if [ ! -f "$LIB" ]; then
  echo "missing $LIB: run 'cargo build --release' (or 'cargo build') first" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

REPORT="$PROFILE_DIR/python-tests.xml"
rm -f "$REPORT"
if [ "${RADIXKV_PY_NO_INSTALL:-0}" = 1 ]; then
  # Offline without setuptools+wheel: run the suite from the source tree instead.
  echo "== RADIXKV_PY_NO_INSTALL=1: testing bindings/python in place (no pip install)"
  PY="$PYTHON"
  ( cd "$ROOT/bindings/python" && RADIXKV_LIB="$LIB" PYTHONPATH="$ROOT/bindings/python" \
      "$PY" -m pytest -q -p no:cacheprovider --junitxml="$REPORT" tests )
else
  VENV="$PROFILE_DIR/python-venv"
  rm -rf "$VENV"
  "$PYTHON" -m venv --system-site-packages "$VENV" || { echo "0 passed, 1 failed"; exit 1; }
  PY="$VENV/bin/python"
  PIP_FLAGS=(--quiet --no-deps --disable-pip-version-check)
  if "$PY" -c "import setuptools, wheel" 2>/dev/null; then PIP_FLAGS+=(--no-build-isolation); fi
  echo "== pip install bindings/python (bundling $LIB)"
  # A copy of the sources, so that the build leaves nothing behind in the checkout.
  SRC="$PROFILE_DIR/python-src"
  rm -rf "$SRC" && mkdir -p "$SRC" && cp -r "$ROOT/bindings/python/." "$SRC/" &&
    rm -rf "$SRC/build" "$SRC"/*.egg-info
  if ! RADIXKV_LIB="$LIB" "$PY" -m pip install "${PIP_FLAGS[@]}" "$SRC"; then
    echo "pip install failed (offline without setuptools and wheel? RADIXKV_PY_NO_INSTALL=1 tests in place)"
    echo "0 passed, 1 failed"
    exit 1
  fi
  # Run from outside the source tree, with RADIXKV_LIB unset: the installed package must
  # find its bundled library.
  ( cd "$VENV" && env -u RADIXKV_LIB "$PY" -m pytest -q -p no:cacheprovider \
      --junitxml="$REPORT" "$ROOT/bindings/python/tests" )
fi
rc=$?
"$PY" - "$REPORT" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 passed, 1 failed"); sys.exit(0)
suites = [root] if root.tag == "testsuite" else list(root)
n = sum(int(s.get("tests", 0)) for s in suites)
bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(f"{n - bad - skipped} passed, {bad} failed" + (f" ({skipped} skipped)" if skipped else ""))
PYEOF
exit $rc
