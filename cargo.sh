#!/usr/bin/env bash
# cargo.sh: cargo, after installing what building Weir needs and the machine lacks.
#
#   ./cargo.sh ARGS...      check the system packages, install any that are missing, then run
#                           `cargo ARGS...` (e.g. ./cargo.sh test --release --workspace)
#
# Building Weir needs, besides Rust (rustup, stable >= the workspace's rust-version):
#   - a C and a C++ compiler (cc, c++): RocksDB, lz4 and mimalloc are compiled from source;
#   - libclang and clang's builtin headers: librocksdb-sys generates its Rust bindings with
#     bindgen on every build (it ships no pre-generated ones), and bindgen loads libclang.
# Testing it (`./cargo.sh test ...`) also needs a headless browser: the web page test drives
# Chromium through chromedriver (Debian packages chromium and chromium-driver).
# What is missing is installed with apt-get (Debian, Ubuntu), through sudo when not root. On other
# systems, or without the rights to install, it stops and says what to install. Once everything
# is present it costs a few file tests and nothing is printed.
#
# Environment:
#   WEIR_SETUP=dry-run   print what was found and the commands it would run; run nothing
#   WEIR_SETUP=skip      skip the checks and run cargo directly
#   LIBCLANG_PATH        a directory holding libclang.so* (as for bindgen); taken as given
#   CC, CXX              the C and C++ compilers (as for cc-rs); default cc and c++
#   WEIR_CHROMIUM, WEIR_CHROMEDRIVER
#                        the browser and its driver the web page test starts (default chromium
#                        and chromedriver on PATH); when set, taken as given (never installed)
set -euo pipefail

say() { printf 'cargo.sh: %s\n' "$*" >&2; }
die() {
  say "error: $1"
  shift
  for line in "$@"; do printf '  %s\n' "$line" >&2; done
  exit 1
}

mode=${WEIR_SETUP:-install}
case "$mode" in
  install | dry-run | skip) ;;
  *) die "WEIR_SETUP=$mode is not one of: install, dry-run, skip" ;;
esac

# --- detection --------------------------------------------------------------------------------

# The directories clang-sys searches for libclang on Linux (after LIBCLANG_PATH and
# `llvm-config --libdir`), as shell globs.
libclang_dirs() {
  if command -v llvm-config >/dev/null 2>&1; then llvm-config --libdir 2>/dev/null || true; fi
  local pattern dir
  for pattern in '/usr/local/llvm*/lib*' '/usr/local/lib*/*/*' '/usr/local/lib*/*' '/usr/local/lib*' \
    '/usr/lib*/*/*' '/usr/lib*/*' '/usr/lib*'; do
    for dir in $pattern; do [ -d "$dir" ] && printf '%s\n' "$dir"; done
  done
}

# Prints the first libclang shared library in directory $1, if any.
libclang_in() {
  local f
  for f in "$1"/libclang.so "$1"/libclang-*.so "$1"/libclang.so.* "$1"/libclang-*.so.*; do
    # libclang-cpp is the C++ API library, which bindgen cannot use (clang-sys skips it too).
    if [ -e "$f" ] && [[ $f != *-cpp.* ]]; then
      printf '%s\n' "$f"
      return 0
    fi
  done
  return 1
}

# Prints the libclang bindgen will load, or fails.
find_libclang() {
  if [ -n "${LIBCLANG_PATH:-}" ]; then
    libclang_in "$LIBCLANG_PATH"
    return
  fi
  local dir
  while IFS= read -r dir; do
    libclang_in "$dir" && return 0
  done < <(libclang_dirs)
  return 1
}

# Prints clang's builtin headers directory (stddef.h and friends; bindgen needs them to parse
# RocksDB's c.h), looking next to the library $1 and in the usual install places, or fails.
find_clang_headers() {
  local libdir h
  libdir=$(dirname "$(readlink -f "$1")")
  for h in "$libdir"/clang/*/include/stddef.h /usr/lib/llvm-*/lib/clang/*/include/stddef.h \
    /usr/lib*/clang/*/include/stddef.h /usr/local/lib*/clang/*/include/stddef.h \
    /usr/local/llvm*/lib*/clang/*/include/stddef.h; do
    if [ -e "$h" ]; then
      dirname "$h"
      return 0
    fi
  done
  return 1
}

missing=()   # human-readable list of what is missing
packages=()  # the Debian packages that provide it

if [ "$mode" != skip ]; then
  command -v cargo >/dev/null 2>&1 ||
    die "cargo is not on PATH." "Install Rust with rustup (https://rustup.rs), then open a new shell" \
      "or run: . \"\$HOME/.cargo/env\""

  cc_bin=${CC:-cc}
  cxx_bin=${CXX:-c++}
  if ! command -v "${cc_bin%% *}" >/dev/null 2>&1; then
    missing+=("a C compiler ($cc_bin)")
    packages+=(gcc)
  fi
  if ! command -v "${cxx_bin%% *}" >/dev/null 2>&1; then
    missing+=("a C++ compiler ($cxx_bin)")
    packages+=(g++)
  fi

  if lib=$(find_libclang); then
    if [ -n "${LIBCLANG_PATH:-}" ]; then
      [ "$mode" = dry-run ] && say "found libclang: $lib (LIBCLANG_PATH)"
    elif headers=$(find_clang_headers "$lib"); then
      [ "$mode" = dry-run ] && say "found libclang: $lib; builtin headers: $headers"
    else
      missing+=("clang's builtin headers (stddef.h), next to $lib")
      packages+=(libclang-dev)
    fi
  elif [ -n "${LIBCLANG_PATH:-}" ]; then
    die "LIBCLANG_PATH=$LIBCLANG_PATH holds no libclang.so*." \
      "Point it at the directory of libclang.so, or unset it to use the system's libclang."
  else
    missing+=("libclang (bindgen, run by librocksdb-sys, loads it)")
    packages+=(libclang-dev)
  fi

  # The cargo subcommand: the first argument that is not an option or a `+toolchain`.
  subcommand=
  for arg in "$@"; do
    case "$arg" in
      -* | +*) ;;
      *)
        subcommand=$arg
        break
        ;;
    esac
  done
  if [ "$subcommand" = test ]; then
    chromium_bin=${WEIR_CHROMIUM:-chromium}
    driver_bin=${WEIR_CHROMEDRIVER:-chromedriver}
    for var in WEIR_CHROMIUM WEIR_CHROMEDRIVER; do
      if [ -n "${!var:-}" ] && ! command -v "${!var}" >/dev/null 2>&1; then
        die "$var=${!var} is not a program." \
          "Point it at the browser (WEIR_CHROMIUM) or its driver (WEIR_CHROMEDRIVER), or unset" \
          "it to use chromium and chromedriver from PATH (installed here when missing)."
      fi
    done
    if ! command -v "$chromium_bin" >/dev/null 2>&1 || ! command -v "$driver_bin" >/dev/null 2>&1; then
      missing+=("a headless browser and its driver for the web page test ($chromium_bin, $driver_bin)")
      packages+=(chromium chromium-driver)
    elif [ "$mode" = dry-run ]; then
      say "found the browser: $(command -v "$chromium_bin"); its driver: $(command -v "$driver_bin")"
    fi
  fi
fi

# --- installation -----------------------------------------------------------------------------

if [ ${#missing[@]} -gt 0 ]; then
  readarray -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
  say "missing: $(IFS=';'; echo "${missing[*]}" | sed 's/;/; /g')"

  if ! command -v apt-get >/dev/null 2>&1; then
    die "no apt-get here, so I cannot install them myself. Install, then run me again:" \
      "Fedora/RHEL: dnf install clang-devel gcc-c++ (tests: chromium chromedriver)" \
      "Arch: pacman -S clang gcc (tests: chromium)" \
      "macOS: xcode-select --install (or brew install llvm, then LIBCLANG_PATH=\$(brew --prefix llvm)/lib);" \
      "  tests: brew install --cask chromium chromedriver" \
      "A browser elsewhere: WEIR_CHROMIUM=/path/to/chrome WEIR_CHROMEDRIVER=/path/to/chromedriver"
  fi

  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      [ "$mode" = dry-run ] && say "would stop here:"
      die "installing needs root, and sudo is not available. As root, run:" \
        "apt-get update && apt-get install -y --no-install-recommends ${packages[*]}"
    fi
  fi

  update=("${sudo[@]}" apt-get update -q)
  install=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q
    --no-install-recommends "${packages[@]}")
  if [ "$mode" = dry-run ]; then
    say "would run: ${update[*]}"
    say "would run: ${install[*]}"
  else
    say "installing ${packages[*]}:"
    say "+ ${update[*]}"
    "${update[@]}" || die "apt-get update failed (see above)." \
      "Check the network and the apt sources, or install ${packages[*]} yourself."
    say "+ ${install[*]}"
    "${install[@]}" || die "apt-get install failed (see above)." \
      "Install ${packages[*]} yourself, then run me again."
    lib=$(find_libclang) && find_clang_headers "$lib" >/dev/null ||
      die "libclang is still not found after installing ${packages[*]}." \
        "Set LIBCLANG_PATH to the directory of libclang.so and run me again."
    if [ "$subcommand" = test ]; then
      command -v "$chromium_bin" >/dev/null 2>&1 && command -v "$driver_bin" >/dev/null 2>&1 ||
        die "$chromium_bin or $driver_bin is still not on PATH after installing ${packages[*]}." \
          "Set WEIR_CHROMIUM and WEIR_CHROMEDRIVER to the browser and its driver."
    fi
    say "installed ${packages[*]}"
  fi
elif [ "$mode" = dry-run ]; then
  say "nothing to install"
fi

# --- cargo ------------------------------------------------------------------------------------

if [ "$mode" = dry-run ]; then
  say "would run: cargo $*"
  exit 0
fi
exec cargo "$@"
