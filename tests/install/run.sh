#!/usr/bin/env bash
# Tests scripts/install: installs the already built libraries into a temporary prefix, checks
# the layout (SONAME libradixkv.so.ABI and its symlinks, stripped libraries with split debug
# info, headers usable from the one include folder, pkg-config and CMake files), then builds
# the C and C++ examples (examples/c, examples/cpp) against the installed prefix with CMake
# (find_package; shared and static targets) and with pkg-config (radixkv and
# radixkv-static), runs every binary without LD_LIBRARY_PATH, and checks that the static
# ones do not need libradixkv.so. Also: bad arguments are refused, the CMake version check
# refuses incompatible versions, and a DESTDIR-staged install with a deeper libdir still
# works once moved (the CMake package is relocatable); docs/install.md shows the examples
# verbatim, and the C one's output as it prints it.
#
#   cargo build --release --lib
#   tests/install/run.sh [PROFILE_DIR]   # default: $CARGO_TARGET_DIR/release, else
#                                        # target/release (what `cargo build --release` leaves)
#
# Needs cmake, pkg-config, cc, c++ and binutils (readelf, objcopy, strip, nm); gdb is used
# when present. Environment: CC (default cc), CXX (default c++). Prints "N passed, M failed"
# (steps) last and exits non-zero if any step failed.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PROFILE_DIR="${1:-${CARGO_TARGET_DIR:-target}/release}"
case "$PROFILE_DIR" in /*) ;; *) PROFILE_DIR="$ROOT/$PROFILE_DIR" ;; esac
CC="${CC:-cc}"
CXX="${CXX:-c++}"
OUT="$PROFILE_DIR/install-tests"
P="$OUT/prefix"
LOG="$OUT/logs"
rm -rf "$OUT" && mkdir -p "$LOG" || exit 1

pass=0
fail=0
step() { # step NAME FUNCTION...: a failure prints why (what the function printed) and counts
  local name="$1"; shift
  echo "== $name"
  if "$@"; then
    pass=$((pass + 1)); echo "   ok: $name"
  else
    fail=$((fail + 1)); echo "   FAILED: $name"
  fi
}
bad() { echo "   $*" >&2; return 1; }
run_log() { # run_log LOGNAME CMD...
  local name="$1"; shift
  if "$@" >"$LOG/$name.log" 2>&1; then return 0; fi
  echo "   command failed: $*" >&2
  tail -n 40 "$LOG/$name.log" | sed 's/^/   | /' >&2
  return 1
}

for tool in cmake pkg-config readelf objcopy strip nm "$CC" "$CXX"; do
  if ! command -v "$tool" >/dev/null; then
    echo "$tool not found: the install tests need cmake, pkg-config, a C and a C++ compiler and binutils" >&2
    echo "0 passed, 1 failed"
    exit 1
  fi
done
for lib in libradixkv.a libradixkv.so; do
  if [ ! -f "$PROFILE_DIR/$lib" ]; then
    echo "missing $PROFILE_DIR/$lib: run 'cargo build --release --lib' first" >&2
    echo "0 passed, 1 failed"
    exit 1
  fi
done

ABI="$(sed -n 's/^#define RKV_ABI_VERSION \([0-9][0-9]*\)$/\1/p' "$ROOT/include/radixkv.h")"
VERSION="$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' "$ROOT/Cargo.toml" | head -n1)"
SONAME="libradixkv.so.$ABI"
REAL="$SONAME.$(echo "$VERSION" | cut -d. -f2,3)"
L="$P/lib"
# The pieces radixkv.hpp includes (bindings/cpp/radixkv/NAME.hpp), installed in include/radixkv/.
PIECES=()
for f in "$ROOT"/bindings/cpp/radixkv/*.hpp; do [ -f "$f" ] && PIECES+=("${f##*/}"); done
[ "${#PIECES[@]}" -gt 0 ] || { echo "no header pieces in $ROOT/bindings/cpp/radixkv/" >&2; echo "0 passed, 1 failed"; exit 1; }
PIECES_CMAKE="$(printf '%s\n' "${PIECES[@]%.hpp}" | paste -sd' ')"
echo "radixkv $VERSION, ABI $ABI: expecting $L/$REAL with SONAME $SONAME"

# --- bad input -------------------------------------------------------------------------
refused() { # refused EXPECTED_MESSAGE ARGS...: scripts/install ARGS must fail saying so
  local want="$1"; shift
  local err
  if err="$("$ROOT/scripts/install" "$@" 2>&1 >/dev/null)"; then
    bad "scripts/install $* succeeded; it must refuse"
    return 1
  fi
  case "$err" in
    *"$want"*) ;;
    *) bad "scripts/install $*: expected '$want' in its error, got: $err"; return 1 ;;
  esac
}
bad_input() {
  local nowhere="$OUT/never"
  refused "--prefix DIR is required" &&
    refused "--prefix DIR is required" --libdir lib &&
    refused "--prefix needs a value" --prefix &&
    refused "unknown argument '--frobnicate'" --prefix "$nowhere" --frobnicate &&
    refused "unknown argument 'extra'" --prefix "$nowhere" extra &&
    refused "must be a plain relative path" --prefix "$nowhere" --libdir ../lib &&
    refused "is not inside the prefix" --prefix "$nowhere" --libdir /usr/lib &&
    refused "cannot carry" --prefix "$OUT/with space" --no-build &&
    refused "not found: build it" --prefix "$nowhere" --lib-from "$OUT/no-such-dir" || return 1
  # A library built without the SONAME is refused (a stale build from before build.rs).
  mkdir -p "$OUT/nosoname" &&
    printf 'int rkv_abi_version(void) { return 1; }\n' | "$CC" -shared -fPIC -x c - -o "$OUT/nosoname/libradixkv.so" &&
    cp "$PROFILE_DIR/libradixkv.a" "$OUT/nosoname/" || return 1
  refused "has SONAME 'none', expected '$SONAME'" --prefix "$nowhere" --lib-from "$OUT/nosoname" || return 1
  [ ! -e "$nowhere" ] || bad "a refused install created $nowhere"
}
step "bad arguments are refused with a clear error" bad_input

# --- install ---------------------------------------------------------------------------
step "scripts/install --prefix $P --lib-from $PROFILE_DIR" \
  run_log install "$ROOT/scripts/install" --prefix "$P" --lib-from "$PROFILE_DIR"
sed 's/^/   /' "$LOG/install.log"

soname_of() { readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p'; }
has_section() { readelf -S -W "$1" 2>/dev/null | grep -q " $2 "; }
bytes() { stat -c %s "$1"; }
layout() {
  local f
  for f in "$L/$REAL" "$L/libradixkv.a" "$L/.debug/$REAL.debug" "$P/include/radixkv.h" \
    "$P/include/radixkv.hpp" "$L/pkgconfig/radixkv.pc" "$L/pkgconfig/radixkv-static.pc" \
    "$L/cmake/radixkv/radixkvConfig.cmake" "$L/cmake/radixkv/radixkvConfigVersion.cmake" \
    "${PIECES[@]/#/$P/include/radixkv/}"; do
    [ -f "$f" ] && [ ! -L "$f" ] || { bad "missing (or not a plain file): $f"; return 1; }
  done
  # Exactly the source tree's pieces, each named in radixkvConfig.cmake's file check.
  local installed
  installed="$(cd "$P/include/radixkv" && ls)"
  [ "$installed" = "$(printf '%s\n' "${PIECES[@]}")" ] ||
    { bad "include/radixkv/ holds '${installed//$'\n'/ }', expected '${PIECES[*]}'"; return 1; }
  grep -q "^foreach(_radixkv_piece ${PIECES_CMAKE})$" "$L/cmake/radixkv/radixkvConfig.cmake" ||
    { bad "radixkvConfig.cmake does not check the pieces ${PIECES_CMAKE}"; return 1; }
  [ "$(readlink "$L/$SONAME")" = "$REAL" ] || { bad "$L/$SONAME is not a symlink to $REAL"; return 1; }
  [ "$(readlink "$L/libradixkv.so")" = "$SONAME" ] || { bad "$L/libradixkv.so is not a symlink to $SONAME"; return 1; }
  local s
  for f in "$L/$REAL" "$L/libradixkv.so" "$PROFILE_DIR/libradixkv.so"; do
    s="$(soname_of "$f")"
    [ "$s" = "$SONAME" ] || { bad "readelf -d $f: SONAME '$s', expected '$SONAME'"; return 1; }
  done
  echo "   readelf -d: SONAME $SONAME (installed and build-tree library)"
  # Exactly the C ABI is exported.
  local exported others
  exported="$(nm -D --defined-only "$L/$REAL" | grep -c ' T rkv_')"
  others="$(nm -D --defined-only "$L/$REAL" | grep -vc ' T rkv_')"
  [ "$exported" -ge 20 ] && [ "$others" -eq 0 ] ||
    { bad "the .so exports $exported rkv_ functions and $others other symbols"; return 1; }
  return 0
}
step "layout, symlinks, SONAME $SONAME" layout

stripped() {
  has_section "$L/$REAL" .debug_info && { bad "$L/$REAL still has .debug_info"; return 1; }
  has_section "$L/$REAL" .symtab && { bad "$L/$REAL still has a .symtab"; return 1; }
  local link
  link="$(readelf -W --string-dump=.gnu_debuglink "$L/$REAL" 2>/dev/null | sed -n 's/^ *\[ *0\] *//p')"
  [ "$link" = "$REAL.debug" ] || { bad "$L/$REAL: .gnu_debuglink '$link', expected '$REAL.debug'"; return 1; }
  has_section "$L/.debug/$REAL.debug" .debug_info || { bad "$L/.debug/$REAL.debug has no .debug_info"; return 1; }
  has_section "$PROFILE_DIR/libradixkv.a" .debug_info || echo "   (the built archive has no debug info either)"
  if readelf -S -W "$L/libradixkv.a" | grep -qE ' \.debug_info | \.llvmbc '; then
    bad "$L/libradixkv.a still has .debug_info or .llvmbc sections"; return 1
  fi
  nm "$L/libradixkv.a" 2>/dev/null | grep -q ' T rkv_cache_new$' ||
    { bad "$L/libradixkv.a lost its symbol rkv_cache_new"; return 1; }
  local so a so0 a0
  so="$(bytes "$L/$REAL")" a="$(bytes "$L/libradixkv.a")"
  so0="$(bytes "$PROFILE_DIR/libradixkv.so")" a0="$(bytes "$PROFILE_DIR/libradixkv.a")"
  echo "   sizes: .so $so0 -> $so bytes, .a $a0 -> $a bytes, debug file $(bytes "$L/.debug/$REAL.debug") bytes"
  # Today about 1.7 MB and 9.4 MB (2.6 MB and 16.7 MB while the KV-event publisher ran on
  # tokio and zeromq; the .so was 0.7 MB before rkv_events_publish put a publisher behind
  # the C ABI, libzmq now); the archive carries every dependency's objects (a link keeps
  # only what it uses). The bounds catch debug info (28 MB here) or bitcode creeping back in.
  [ "$so" -lt 4000000 ] || { bad "the installed .so is $so bytes (over 4 MB: not stripped?)"; return 1; }
  [ "$a" -lt 24000000 ] || { bad "the installed .a is $a bytes (over 24 MB: not stripped?)"; return 1; }
  if command -v gdb >/dev/null; then
    # gdb finds the split debug info through the debuglink (LIBDIR/.debug/).
    local line
    line="$(gdb -nx -batch -ex 'info line rkv_cache_new' "$L/$SONAME" 2>&1)"
    case "$line" in
      *'crates/ffi/src/'*) echo "   gdb: ${line%% starts at*}" ;;
      *) bad "gdb found no line info for rkv_cache_new in $L/$SONAME: $line"; return 1 ;;
    esac
  else
    echo "   (gdb not found: the debug file is checked with readelf only)"
  fi
}
step "libraries stripped, debug info split into lib/.debug" stripped

headers() {
  printf '#include <radixkv.h>\nint main(void) { return rkv_abi_version() == RKV_ABI_VERSION ? 0 : 1; }\n' >"$OUT/h.c"
  printf '#include <radixkv.hpp>\nint main() { return rkv::abi_version() == RKV_ABI_VERSION ? 0 : 1; }\n' >"$OUT/h.cpp"
  run_log header-c "$CC" -std=c99 -Wall -Wextra -Werror -pedantic -fsyntax-only -I "$P/include" "$OUT/h.c" &&
    run_log header-cpp "$CXX" -std=c++17 -Wall -Wextra -Werror -pedantic -fsyntax-only -I "$P/include" "$OUT/h.cpp" &&
    cmp -s "$P/include/radixkv.h" "$ROOT/include/radixkv.h" &&
    cmp -s "$P/include/radixkv.hpp" "$ROOT/bindings/cpp/radixkv.hpp" || return 1
  # radixkv.hpp finds radixkv.h and its pieces beside it: included by its path, no -I.
  printf '#include "%s"\nint main() { return rkv::abi_version() == RKV_ABI_VERSION ? 0 : 1; }\n' \
    "$P/include/radixkv.hpp" >"$OUT/h-path.cpp"
  run_log header-cpp-path "$CXX" -std=c++17 -Wall -Wextra -Werror -pedantic -fsyntax-only "$OUT/h-path.cpp" ||
    return 1
  # Each piece of radixkv.hpp is the source's, and compiles alone from the include folder.
  local piece
  for piece in "${PIECES[@]}"; do
    cmp -s "$P/include/radixkv/$piece" "$ROOT/bindings/cpp/radixkv/$piece" ||
      { bad "installed include/radixkv/$piece differs from bindings/cpp/radixkv/$piece"; return 1; }
    printf '#include <radixkv/%s>\nint main() { return 0; }\n' "$piece" >"$OUT/h-$piece.cpp"
    run_log "header-${piece%.hpp}" "$CXX" -std=c++17 -Wall -Wextra -Werror -pedantic -fsyntax-only \
      -I "$P/include" "$OUT/h-$piece.cpp" || return 1
  done
}
step "headers compile from the one include folder (C99, C++17)" headers

# --- running the examples ----------------------------------------------------------------
needs_lib() { readelf -d "$1" | grep -q "(NEEDED).*\[libradixkv\.so"; }
check_run() { # check_run BINARY shared|static: runs without LD_LIBRARY_PATH; checks linkage
  local bin="$1" kind="$2" out
  [ -x "$bin" ] || { bad "$bin was not built"; return 1; }
  if [ "$kind" = shared ]; then
    readelf -d "$bin" | grep -q "(NEEDED).*\[$SONAME\]" ||
      { bad "$bin does not record NEEDED $SONAME"; return 1; }
    local resolved
    resolved="$(env -u LD_LIBRARY_PATH ldd "$bin" |
      sed -n -e "s/^[[:space:]]*$SONAME => not found.*/not found/p" -e "s/^[[:space:]]*$SONAME => \(.*\) (0x.*/\1/p")"
    [ "$resolved" = "$L/$SONAME" ] ||
      { bad "$bin loads $SONAME from '${resolved:-nowhere}', expected $L/$SONAME"; return 1; }
  else
    needs_lib "$bin" && { bad "$bin (static) needs libradixkv.so: $(readelf -d "$bin" | grep NEEDED)"; return 1; }
  fi
  out="$(env -u LD_LIBRARY_PATH "$bin" 2>&1)" || { bad "$bin failed:"; echo "$out" | sed 's/^/   | /' >&2; return 1; }
  case "$out" in
    *"request 2: 5 of 8 tokens cached"*ok) ;;
    *) bad "$bin printed something unexpected:"; echo "$out" | sed 's/^/   | /' >&2; return 1 ;;
  esac
  echo "   $(basename "$bin") ($kind): $(echo "$out" | sed -n 2,3p | paste -sd';' -)"
}

cmake_example() { # cmake_example c|cpp PREFIX [EXPECTED_LIBDIR]
  local lang="$1" prefix="$2" libdir="${3:-$2/lib}" build="$OUT/cmake-$1-$(basename "$2")"
  run_log "cmake-$lang-configure-$(basename "$2")" cmake -S "$ROOT/examples/$lang" -B "$build" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
    -DCMAKE_BUILD_TYPE=Release || return 1
  grep -q "radixkv $VERSION from $libdir/cmake/radixkv" "$LOG/cmake-$lang-configure-$(basename "$2").log" ||
    { bad "CMake did not find radixkv $VERSION in $libdir/cmake/radixkv:"; grep radixkv "$LOG/cmake-$lang-configure-$(basename "$2").log" >&2; return 1; }
  run_log "cmake-$lang-build-$(basename "$2")" cmake --build "$build" || return 1
  local saved_L="$L"
  L="$libdir"
  check_run "$build/radixkv_example_$lang" shared && check_run "$build/radixkv_example_${lang}_static" static
  local rc=$?
  L="$saved_L"
  return $rc
}
step "CMake: examples/c (radixkv::radixkv, radixkv::radixkv_static)" cmake_example c "$P"
step "CMake: examples/cpp (radixkv::radixkv, radixkv::radixkv_static)" cmake_example cpp "$P"

cmake_versions() {
  local proj="$OUT/cmake-version"
  mkdir -p "$proj"
  try_version() { # try_version "VERSION ARGS" yes|no
    printf 'cmake_minimum_required(VERSION 3.16)\nproject(v LANGUAGES C)\nfind_package(radixkv %s REQUIRED)\n' "$1" \
      >"$proj/CMakeLists.txt"
    rm -rf "$proj/build"
    if cmake -S "$proj" -B "$proj/build" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
      >"$LOG/cmake-version.log" 2>&1; then
      [ "$2" = yes ] || { bad "find_package(radixkv $1) succeeded against $VERSION; it must fail"; return 1; }
    else
      [ "$2" = no ] || { bad "find_package(radixkv $1) failed against $VERSION:"; tail -n 15 "$LOG/cmake-version.log" >&2; return 1; }
    fi
  }
  local major minor patch
  IFS=. read -r major minor patch <<<"$VERSION"
  try_version "" yes && try_version "$major.$minor" yes && try_version "$VERSION EXACT" yes &&
    try_version "$major" yes && try_version "$major.$minor...$((major + 1))" yes &&
    try_version "$major.$((minor + 1))" no && try_version "$((major + 1))" no &&
    try_version "$major.$minor.$((patch + 1))" no && try_version "$major.$((minor + 1))...$((major + 2))" no
}
step "CMake: radixkvConfigVersion accepts $VERSION-compatible requests only" cmake_versions

pc() { PKG_CONFIG_PATH="$L/pkgconfig" PKG_CONFIG_LIBDIR="$L/pkgconfig" pkg-config "$@"; }
pkgconfig_files() {
  [ "$(pc --modversion radixkv)" = "$VERSION" ] || { bad "pkg-config --modversion radixkv: $(pc --modversion radixkv 2>&1)"; return 1; }
  [ "$(pc --variable=libdir radixkv)" = "$L" ] || { bad "pkg-config --variable=libdir radixkv: $(pc --variable=libdir radixkv)"; return 1; }
  case " $(pc --libs radixkv-static) " in
    *" $L/libradixkv.a "*) ;;
    *) bad "pkg-config --libs radixkv-static does not name $L/libradixkv.a: $(pc --libs radixkv-static)"; return 1 ;;
  esac
  [ "$(pc --libs radixkv-static)" = "$(pc --static --libs radixkv-static)" ] ||
    { bad "radixkv-static gives other flags with --static"; return 1; }
  if pc --help 2>&1 | grep -q -- --validate; then
    pc --validate radixkv && pc --validate radixkv-static || { bad "pkg-config --validate failed"; return 1; }
  fi
}
step "pkg-config files (radixkv.pc, radixkv-static.pc)" pkgconfig_files

pkgconfig_example() { # pkgconfig_example c|cpp
  local lang="$1" build="$OUT/pkgconfig-$1" compiler src std
  mkdir -p "$build"
  if [ "$lang" = c ]; then compiler="$CC" src="$ROOT/examples/c/main.c" std=-std=c99
  else compiler="$CXX" src="$ROOT/examples/cpp/main.cpp" std=-std=c++17; fi
  # Shared, as docs/install.md shows: the rpath from the .pc's libdir.
  # shellcheck disable=SC2046
  run_log "pc-$lang-shared" "$compiler" $std -Wall -Wextra -Werror "$src" -o "$build/shared" \
    $(pc --cflags --libs radixkv) -Wl,-rpath,"$(pc --variable=libdir radixkv)" || return 1
  check_run "$build/shared" shared || return 1
  # Static: radixkv-static names the archive; --as-needed (Ubuntu's default) checks the order.
  # shellcheck disable=SC2046
  run_log "pc-$lang-static" "$compiler" $std -Wall -Wextra -Werror "$src" -o "$build/static" \
    -Wl,--as-needed $(pc --cflags --libs radixkv-static) || return 1
  check_run "$build/static" static
}
step "pkg-config: examples/c (radixkv, radixkv-static)" pkgconfig_example c
step "pkg-config: examples/cpp (radixkv, radixkv-static)" pkgconfig_example cpp

# A staged install (DESTDIR) with a deeper libdir, then moved elsewhere: the .pc names the
# prefix it was configured for, and the CMake package finds itself relative to its folder.
staged() {
  local stage="$OUT/stage" want="/opt/radixkv-test" moved="$OUT/moved"
  run_log staged env DESTDIR="$stage" "$ROOT/scripts/install" --prefix "$want" \
    --libdir lib/x86_64-linux-gnu --lib-from "$PROFILE_DIR" || return 1
  [ ! -e "$want" ] || { bad "a DESTDIR install wrote into $want"; return 1; }
  local ml="$stage$want/lib/x86_64-linux-gnu"
  [ -f "$ml/$REAL" ] && [ -f "$ml/cmake/radixkv/radixkvConfig.cmake" ] ||
    { bad "staged files not under $ml"; return 1; }
  grep -qx "prefix=$want" "$ml/pkgconfig/radixkv.pc" &&
    grep -qx 'libdir=${exec_prefix}/lib/x86_64-linux-gnu' "$ml/pkgconfig/radixkv.pc" ||
    { bad "radixkv.pc does not name prefix $want and libdir lib/x86_64-linux-gnu:"; cat "$ml/pkgconfig/radixkv.pc" >&2; return 1; }
  mv "$stage$want" "$moved" || return 1
  cmake_example c "$moved" "$moved/lib/x86_64-linux-gnu"
}
step "DESTDIR + --libdir lib/x86_64-linux-gnu, moved: CMake examples/c" staged

# docs/install.md shows the examples: each block after a `<!-- verbatim: FILE -->` line must
# be FILE exactly, and every example file must be shown.
docs_verbatim() {
  local doc="$ROOT/docs/install.md" f n=0
  for f in examples/c/CMakeLists.txt examples/c/main.c examples/cpp/CMakeLists.txt examples/cpp/main.cpp; do
    grep -qx "<!-- verbatim: $f -->" "$doc" || { bad "docs/install.md does not show $f"; return 1; }
  done
  while IFS= read -r f; do
    n=$((n + 1))
    awk -v f="$f" '
      $0 == "<!-- verbatim: " f " -->" { want = 1; next }
      want == 1 && /^```/ { want = 2; next }
      want == 2 && /^```$/ { exit }
      want == 2 { print }' "$doc" >"$OUT/verbatim.txt"
    cmp -s "$OUT/verbatim.txt" "$ROOT/$f" ||
      { bad "docs/install.md's copy of $f differs from the file:"; diff "$OUT/verbatim.txt" "$ROOT/$f" | head -n 10 >&2; return 1; }
  done < <(sed -n 's/^<!-- verbatim: \(.*\) -->$/\1/p' "$doc")
  echo "   $n files shown verbatim"
  # And the output shown is what the C example prints.
  awk '$0 == "<!-- output: examples/c/main.c -->" { want = 1; next }
       want == 1 && /^```/ { want = 2; next }
       want == 2 && /^```$/ { exit }
       want == 2 { print }' "$doc" >"$OUT/output-doc.txt"
  [ -s "$OUT/output-doc.txt" ] || { bad "docs/install.md shows no output of examples/c/main.c"; return 1; }
  env -u LD_LIBRARY_PATH "$OUT/cmake-c-prefix/radixkv_example_c" >"$OUT/output-run.txt" 2>&1 &&
    cmp -s "$OUT/output-doc.txt" "$OUT/output-run.txt" ||
    { bad "the output docs/install.md shows is not what examples/c prints:"; diff "$OUT/output-doc.txt" "$OUT/output-run.txt" >&2; return 1; }
  echo "   and the C example's output"
}
step "docs/install.md shows the examples verbatim" docs_verbatim

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
