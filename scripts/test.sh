#!/usr/bin/env bash
# Sets up this machine (scripts/setup.sh) and runs every test of Themis Mesh:
# formatting and lints, the native suites (with THEMIS_REQUIRE_ALL=1: none may skip;
# then again as an unprivileged user, scripts/test-unprivileged.sh: the tests that need
# root, Envoy or the kernel skip with their reason), the core on wasm32-wasip1 and,
# under the wasmtime CLI, on wasm32-wasip2 (the same vectors and attacks),
# the end-to-end demo (three nodes in network namespaces with eBPF capture), Themis Mesh
# on a real one-node Kubernetes cluster (scripts/k8s/: deploy/ applied as it is, the
# node controller, meshed Deployments), and each fuzz target for a bounded time (built
# and run in the background beside the demo and the cluster). The allocation check is a test
# (benchmarks/tests/allocations.rs). The
# set-up and the demo run with Go hidden (scripts/without-go.sh): neither may need it;
# the cluster's and Istio's binaries (scripts/k8s/build.sh, build-istio.sh, cached) are
# the one part built with Go, in the background while the Rust suites run. As root.
#
#   scripts/test.sh                  everything
#   FUZZ_SECONDS=60 scripts/test.sh  fuzz each target longer (default 15 s)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh

started=$SECONDS
section() { printf '\n'; step "[$(((SECONDS - started) / 60)):$(printf %02d $(((SECONDS - started) % 60)))] $*"; }

# A cold run peaks near 8 GB here (target/ and fuzz/target/, 7.8 GB at 74f9cc9; the
# cluster's binaries and Go cache, built once, another 3 GB: docs/KUBERNETES.md): say
# so before a build fails halfway with "No space left on device".
free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
if ((free_gb < 11)); then
    printf "note: only %s GB free on %s; a cold run of this suite needs about 8 GB, 11 GB with the cluster's first build\n" "$free_gb" "$(df -P . | awk 'NR==2 {print $6}')" >&2
fi
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}   # one build per run: incremental state is only disk

section "set-up, as with Debian 12's Go 1.19 (the tests need no Go)"
scripts/without-go.sh --old-go scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
export THEMIS_EBPF=required   # the eBPF programs are built, never left out (host-agent/themis-capture/build.rs)
FUZZ_SECONDS=${FUZZ_SECONDS:-15}

# Kubernetes, then Istio, from the Go module proxy (about 17 and 9 minutes cold on one
# core, instant when cached), beside the Rust builds; their own process group, stopped
# if this run ends early.
k8s_build_log=$(mktemp /tmp/themis-k8s-build.XXXXXX)
setsid bash -c 'scripts/k8s/build.sh && scripts/k8s/build-istio.sh' > "$k8s_build_log" 2>&1 &
k8s_build=$!
cluster_up=false
fuzz_run=
fuzz_log=
finish() {
    kill -- "-$k8s_build" 2> /dev/null || true
    if [[ -n $fuzz_run ]]; then kill -- "-$fuzz_run" 2> /dev/null || true; fi
    rm -f "$fuzz_log"
    if $cluster_up; then scripts/k8s/cluster.sh down > /dev/null 2>&1 || echo "note: scripts/k8s/cluster.sh down failed" >&2; fi
    rm -f "$k8s_build_log"
}
trap finish EXIT
echo "    the Kubernetes and Istio builds run in the background (scripts/k8s/build.sh, build-istio.sh; log $k8s_build_log)"

section "formatting and lints"
cargo fmt --all --check
rustfmt --check --edition 2021 ebpf/themis-ebpf/src/main.rs   # the eBPF programs' own workspace
cargo clippy -q --workspace --all-targets -- -D warnings
cargo clippy -q -p themis-component --target wasm32-wasip2 -- -D warnings   # its exports exist only there
cargo clippy -q -p themis-envoy --target wasm32-wasip1 -- -D warnings        # so does its Envoy glue
cargo clippy -q -p themis-native --all-targets --features fault-injection -- -D warnings   # the test-only faults

section "native tests (core: vectors, attacks, properties, identities; DHT simulation; agents as processes, on loopback and in network namespaces; eBPF capture on the real kernel with cgroups, Envoy and namespaces; the WIT component embedded in wasmtime; benchmark drivers)"
# THEMIS_TOOL: the `themis` this build makes for themis-cli's tests serves every
# package's (built again with one package's features, it would compile twice).
THEMIS_TOOL="$PWD/target/debug/themis" THEMIS_REQUIRE_ALL=1 \
    cargo test --workspace   # a test that lacks root, Envoy... fails, never skips

section "the same tests as an unprivileged user: root/Envoy/kernel tests skip with their reason"
scripts/test-unprivileged.sh

section "protocol core and Envoy filter for wasm32-wasip1 (Envoy's Wasm target)"
cargo build -q -p themis-core --release --target wasm32-wasip1
cargo build -q -p themis-envoy --release --target wasm32-wasip1   # the filter's tests build it too
echo "    ok"

section "protocol core and mesh trust on wasm32-wasip2 under wasmtime $(wasmtime --version | cut -d' ' -f2): vectors, attacks, identities, sealed streams, trust attacks"
CARGO_TARGET_WASM32_WASIP2_RUNNER="wasmtime run" \
    cargo test -p themis-core --target wasm32-wasip2 --lib --test vectors --test adversarial --test identity --test stream --test flood
# The mesh-trust attacks too: the filter and the component verify records with this code.
CARGO_TARGET_WASM32_WASIP2_RUNNER="wasmtime run" \
    cargo test -p themis-trust --target wasm32-wasip2 --test attacks

# The fuzz targets (nightly, AddressSanitizer; their own target directory) need no
# other stage: built and then run niced beside the demo and the cluster, which wait
# on processes and pods more than they compute; each target still runs its
# FUZZ_SECONDS (libFuzzer's -max_total_time is its own clock, not a share of the
# CPU's), and the fuzz stage then only reports.
fuzz_log=$(mktemp /tmp/themis-fuzz.XXXXXX)
setsid nice -n 10 scripts/fuzz-smoke.sh "$FUZZ_SECONDS" > "$fuzz_log" 2>&1 &
fuzz_run=$!
echo "    the fuzz targets build and run in the background (scripts/fuzz-smoke.sh $FUZZ_SECONDS, log $fuzz_log)"

section "the demo, with no Go at all: three nodes in network namespaces, agents in a ring, Envoy sidecars with the filter, eBPF capture, handler and check by plain URLs, the sealed wire"
scripts/without-go.sh scripts/demo.sh

section "Kubernetes: a real one-node cluster (scripts/k8s/cluster.sh), Themis Mesh applied from deploy/, meshed Deployments, then Istio built here with its own injection (scripts/k8s/suite.sh)"
wait "$k8s_build" || { tail -n 20 "$k8s_build_log"; fail "scripts/k8s/build.sh or build-istio.sh failed (the log above)"; }
grep -E '^ +ok +(Kubernetes|Istio) ' "$k8s_build_log" || true
cluster_up=true
scripts/k8s/cluster.sh up
scripts/k8s/suite.sh
scripts/k8s/cluster.sh down
cluster_up=false

section "fuzz targets, ${FUZZ_SECONDS}s each (run beside the demo and the cluster)"
if ! wait "$fuzz_run"; then
    fuzz_run=
    cat "$fuzz_log"
    fail "a fuzz target failed, or their build did (scripts/fuzz-smoke.sh's output above)"
fi
fuzz_run=
grep '^fuzz-smoke:' "$fuzz_log"

section "all tests passed"
