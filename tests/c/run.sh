#!/usr/bin/env bash
# Builds tests/c/test_abi.c, tests/c/test_events.c (KV events), tests/c/test_policies.c
# (eviction policies, rkv_insert_ex), tests/c/test_tier.c (the host tier), tests/c/test_host_cache.c (the
# host tier through a plain rkv_cache: rkv_match_ex, rkv_cache_load_*), tests/c/test_router.c (the
# router index), tests/c/test_request.c (the request cycle), tests/c/test_events_group.c (the
# KV group of published events), tests/c/test_hybrid.c (the hybrid tree: FULL, SWA, Mamba) and
# tests/c/test_swa.c (a sliding window in the lock-free cache)
# against the static and the shared radixkv library of one cargo profile, runs each, and runs
# each again under valgrind (zero errors, nothing definitely or indirectly lost). Also checks
# that include/radixkv.h compiles as strict C99 and as C++.
#
#   cargo build [--release]            # builds libradixkv.a and libradixkv.so
#   tests/c/run.sh [PROFILE_DIR]       # default: $CARGO_TARGET_DIR/release, else
#                                      # target/release (what `cargo build --release` leaves)
#
# Environment: CC (default cc), CXX (default c++), RADIXKV_NO_VALGRIND=1 to skip valgrind.
# Prints "N passed, M failed" (steps) last; exits non-zero on any failure.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PROFILE_DIR="${1:-${CARGO_TARGET_DIR:-target}/release}"
case "$PROFILE_DIR" in /*) ;; *) PROFILE_DIR="$ROOT/$PROFILE_DIR" ;; esac
CC="${CC:-cc}"
CXX="${CXX:-c++}"
OUT="$PROFILE_DIR/c-tests"
mkdir -p "$OUT"

pass=0
fail=0
step() { # step NAME CMD...
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

CFLAGS=(-std=c99 -Wall -Wextra -Werror -pedantic -g -O1 -I "$ROOT/include")

step "header compiles as C99" \
  "$CC" -std=c99 -Wall -Wextra -Werror -pedantic -I "$ROOT/include" -x c -c -o "$OUT/header_c.o" - <<<'#include "radixkv.h"
int main(void) { return (int)rkv_abi_version() - 1; }'
step "header compiles as C++11" \
  "$CXX" -std=c++11 -Wall -Wextra -Werror -pedantic -I "$ROOT/include" -x c++ -c -o "$OUT/header_cxx.o" - <<<'#include "radixkv.h"
int main() { return static_cast<int>(rkv_abi_version()) - 1; }'

# The library's SONAME is libradixkv.so.1 (build.rs), so the program asks the loader for that
# name, which cargo does not create: a link to the built library in $OUT/lib provides it.
mkdir -p "$OUT/lib" && ln -sfn "$PROFILE_DIR/libradixkv.so" "$OUT/lib/libradixkv.so.1"
TESTS=(test_abi test_events test_policies test_tier test_host_cache test_router test_request test_events_group test_hybrid test_swa)
for t in "${TESTS[@]}"; do
  step "build $t static" "$CC" "${CFLAGS[@]}" "$ROOT/tests/c/$t.c" "$PROFILE_DIR/libradixkv.a" \
    -lstdc++ -lpthread -ldl -lm -o "$OUT/${t}_static"
  step "build $t shared" "$CC" "${CFLAGS[@]}" "$ROOT/tests/c/$t.c" -L "$PROFILE_DIR" -lradixkv \
    -Wl,-rpath,"$OUT/lib" -lpthread -o "$OUT/${t}_shared"
done

for t in "${TESTS[@]}"; do
  step "run $t static" "$OUT/${t}_static"
  step "run $t shared" "$OUT/${t}_shared"
done

if [ "${RADIXKV_NO_VALGRIND:-0}" = 1 ]; then
  echo "== valgrind skipped (RADIXKV_NO_VALGRIND=1)"
elif ! command -v valgrind >/dev/null; then
  echo "valgrind not found (install it, or set RADIXKV_NO_VALGRIND=1 to skip)" >&2
  fail=$((fail + 1))
else
  # "still reachable" blocks (std's and crossbeam-epoch's process-wide globals) are not
  # leaks; definitely and indirectly lost blocks are, and so is any error (no suppressions).
  VG=(valgrind --leak-check=full --show-leak-kinds=definite,indirect
      --errors-for-leak-kinds=definite,indirect --error-exitcode=1 --quiet)
  for t in "${TESTS[@]}"; do
    step "valgrind $t static" "${VG[@]}" "$OUT/${t}_static"
    step "valgrind $t shared" "${VG[@]}" "$OUT/${t}_shared"
  done
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
