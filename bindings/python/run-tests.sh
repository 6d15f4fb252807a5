#!/usr/bin/env bash
# Builds and installs bindings/python (the native extension, with maturin, from the sources
# in place) into a fresh virtual environment and runs its pytest suite against the
# installed package.
#
#   bindings/python/run-tests.sh [PROFILE_DIR]   # default: target/release
#
# PROFILE_DIR names the cargo profile folder of the build to share: the extension is built
# with CARGO_TARGET_DIR set to its parent (target/ by default), so it reuses the radixkv
# crate and the dependencies `cargo build --release` compiled there (only pyo3 and the
# extension itself compile again).
#
# Needs python3 with venv, a Rust toolchain, pytest (numpy optional) importable by python3
# (the venv is made with --system-site-packages), and maturin: taken from the environment
# when python3 can run it, else installed into the venv with pip (PEP 668: never into the
# system). Environment: PYTHON (default python3). Prints "N passed, M failed" last; exits
# non-zero on any failure, a failed build included.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PROFILE_DIR="${1:-${CARGO_TARGET_DIR:-target}/release}"
case "$PROFILE_DIR" in /*) ;; *) PROFILE_DIR="$ROOT/$PROFILE_DIR" ;; esac
mkdir -p "$PROFILE_DIR"
export CARGO_TARGET_DIR
CARGO_TARGET_DIR="$(cd "$PROFILE_DIR/.." && pwd)"
PYTHON="${PYTHON:-python3}"
fail() { echo "$*" >&2; echo "0 passed, 1 failed"; exit 1; }

REPORT="$PROFILE_DIR/python-tests.xml"
rm -f "$REPORT"
VENV="$PROFILE_DIR/python-venv"
rm -rf "$VENV"
"$PYTHON" -m venv --system-site-packages "$VENV" || fail "python3 -m venv $VENV failed"
PY="$VENV/bin/python"
export PATH="$VENV/bin:$PATH"
PIP=("$PY" -m pip --disable-pip-version-check)
if ! "$PY" -m maturin --version >/dev/null 2>&1; then
  echo "== pip install maturin (into $VENV)"
  "${PIP[@]}" install --quiet "maturin>=1.9,<2" || fail "pip install maturin failed (offline?)"
fi
echo "== pip install bindings/python ($("$PY" -m maturin --version), CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
t0=$SECONDS
# In place (the extension depends on the radixkv crate by path); a failed build fails here.
"${PIP[@]}" install --quiet --no-deps --no-build-isolation "$ROOT/bindings/python" ||
  fail "pip install bindings/python failed: the native extension did not build"
echo "== installed in $((SECONDS - t0)) s"
# Run from outside the source tree, with RADIXKV_LIB unset: the installed package must
# load its own extension.
( cd "$VENV" && env -u RADIXKV_LIB "$PY" -m pytest -q -p no:cacheprovider \
    --junitxml="$REPORT" "$ROOT/bindings/python/tests" )
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
