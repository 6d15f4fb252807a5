#!/usr/bin/env bash
# Builds the C++ wrapper test (eight translation units including bindings/cpp/radixkv.hpp)
# with g++ -std=c++17 -Wall -Wextra -Werror against the static library, runs it (8 threads
# hammering one pooled cache), runs a shorter round under valgrind, and checks that
# packaging/radixkv.pc.in works with pkg-config against the shared library (tests/install/run.sh
# tests the full install: scripts/install, CMake, static pkg-config). Also checks that each
# piece of the header (bindings/cpp/radixkv/*.hpp) compiles alone and that radixkv.hpp
# includes every one.
#
#   cargo build [--release]
#   tests/cpp/run.sh [PROFILE_DIR]       # default: $CARGO_TARGET_DIR/release, else
#                                        # target/release (what `cargo build --release` leaves)
#
# Environment: CXX (default g++), RKV_CPP_ITERS (iterations per thread, default 2000),
# RADIXKV_NO_VALGRIND=1 to skip valgrind. Prints "N passed, M failed" (steps) last.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PROFILE_DIR="${1:-${CARGO_TARGET_DIR:-target}/release}"
case "$PROFILE_DIR" in /*) ;; *) PROFILE_DIR="$ROOT/$PROFILE_DIR" ;; esac
CXX="${CXX:-g++}"
OUT="$PROFILE_DIR/cpp-tests"
mkdir -p "$OUT"

pass=0
fail=0
step() {
  local name="$1"; shift
  echo "== $name"
  if "$@"; then pass=$((pass + 1)); echo "   ok: $name"; else fail=$((fail + 1)); echo "   FAILED: $name"; fi
}

for lib in libradixkv.a libradixkv.so; do
  if [ ! -f "$PROFILE_DIR/$lib" ]; then
    echo "missing $PROFILE_DIR/$lib: run 'cargo build' (or 'cargo build --release') first" >&2
    echo "0 passed, 1 failed"
    exit 1
  fi
done

CXXFLAGS=(-std=c++17 -Wall -Wextra -Werror -pedantic -g -O1 -pthread
          -I "$ROOT/include" -I "$ROOT/bindings/cpp")
build() {
  "$CXX" "${CXXFLAGS[@]}" "$ROOT/tests/cpp/test_main.cpp" "$ROOT/tests/cpp/test_api.cpp" \
    "$ROOT/tests/cpp/test_lifetime.cpp" "$ROOT/tests/cpp/test_events.cpp" "$ROOT/tests/cpp/test_tier.cpp" \
    "$ROOT/tests/cpp/test_router.cpp" "$ROOT/tests/cpp/test_request.cpp" "$ROOT/tests/cpp/test_hybrid.cpp" \
    "$PROFILE_DIR/libradixkv.a" -lstdc++ -lpthread -ldl -lm \
    -o "$OUT/test_cpp"
}
# radixkv.hpp is the one include; its pieces (bindings/cpp/radixkv/*.hpp) each include what
# they need: a translation unit including only one piece must compile, and the umbrella must
# include every piece.
pieces_alone() {
  local piece name ok=0
  for piece in "$ROOT"/bindings/cpp/radixkv/*.hpp; do
    [ -f "$piece" ] || { echo "   no pieces under bindings/cpp/radixkv/"; return 1; }
    name="${piece##*/}"
    printf '#include "radixkv/%s"\n' "$name" >"$OUT/piece_${name%.hpp}.cpp"
    if "$CXX" -std=c++17 -Wall -Wextra -Werror -pedantic -fsyntax-only \
      -I "$ROOT/include" -I "$ROOT/bindings/cpp" "$OUT/piece_${name%.hpp}.cpp"; then
      echo "   radixkv/$name compiles alone"
    else
      echo "   radixkv/$name does not compile alone"; ok=1
    fi
    if ! grep -qx "#include \"radixkv/$name\"" "$ROOT/bindings/cpp/radixkv.hpp"; then
      echo "   radixkv.hpp does not include radixkv/$name"; ok=1
    fi
  done
  return "$ok"
}
step "header pieces compile alone (-std=c++17 -fsyntax-only)" pieces_alone
# A hang is a failure (a Lock outliving its Cache used to block forever): every run of the
# test binary is bounded by `timeout` where there is one.
TIMEOUT=()
command -v timeout >/dev/null && TIMEOUT=(timeout "${RKV_CPP_TIMEOUT:-600}")
step "build (8 TUs, -Wall -Wextra -Werror)" build
step "run (8 threads)" "${TIMEOUT[@]}" "$OUT/test_cpp"

if [ "${RADIXKV_NO_VALGRIND:-0}" = 1 ]; then
  echo "== valgrind skipped (RADIXKV_NO_VALGRIND=1)"
elif ! command -v valgrind >/dev/null; then
  echo "valgrind not found (install it, or set RADIXKV_NO_VALGRIND=1 to skip)" >&2
  fail=$((fail + 1))
else
  step "valgrind (8 threads, 150 iterations each)" "${TIMEOUT[@]}" env RKV_CPP_ITERS=150 \
    valgrind --leak-check=full --show-leak-kinds=definite,indirect \
    --errors-for-leak-kinds=definite,indirect --error-exitcode=1 --quiet "$OUT/test_cpp"
fi

pc_check() {
  local stage="$OUT/stage"
  rm -rf "$stage" && mkdir -p "$stage/lib/pkgconfig" "$stage/include/radixkv" || return 1
  # The SONAME is libradixkv.so.1 (build.rs): the real file under that name, -lradixkv's link.
  cp "$PROFILE_DIR/libradixkv.so" "$stage/lib/libradixkv.so.1" &&
    ln -s libradixkv.so.1 "$stage/lib/libradixkv.so" &&
    cp "$PROFILE_DIR/libradixkv.a" "$stage/lib/" &&
    cp "$ROOT/include/radixkv.h" "$ROOT/bindings/cpp/radixkv.hpp" "$stage/include/" &&
    cp "$ROOT"/bindings/cpp/radixkv/*.hpp "$stage/include/radixkv/" || return 1
  sed -e "s|@PREFIX@|$stage|" -e "s|@LIBDIR@|lib|" -e "s|@VERSION@|0.1.0|" -e "s|@ABI@|1|" \
    -e "s|@NATIVE_STATIC_LIBS@|-lpthread -ldl -lm|" "$ROOT/packaging/radixkv.pc.in" \
    > "$stage/lib/pkgconfig/radixkv.pc" || return 1
  if grep '@[A-Z_]*@' "$stage/lib/pkgconfig/radixkv.pc"; then echo "unfilled placeholders"; return 1; fi
  printf '%s\n' '#include "radixkv.hpp"' \
    'int main() { rkv::Cache c; return c.match(0, {}).empty() && rkv::abi_version() == 1 ? 0 : 1; }' \
    > "$OUT/pc_app.cpp"
  # shellcheck disable=SC2046
  "$CXX" -std=c++17 -Wall -Wextra -Werror "$OUT/pc_app.cpp" -o "$OUT/pc_app" \
    $(PKG_CONFIG_PATH="$stage/lib/pkgconfig" pkg-config --cflags --libs radixkv) \
    -Wl,-rpath,"$stage/lib" && "$OUT/pc_app"
}
if command -v pkg-config >/dev/null; then
  step "pkg-config (packaging/radixkv.pc.in)" pc_check
else
  echo "== pkg-config not found: radixkv.pc.in check skipped"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
