#!/usr/bin/env bash
# What the benchmarks need beyond the demo's set-up: scripts/setup.sh --quick, then
# iptables (benchmarks/ebpf: capture against iptables REDIRECT) and Fortio (the load
# generator of benchmarks/envoy and benchmarks/ebpf). benchmarks/*/run.sh call this
# first; a second run takes a second and prints "ok" lines.
#
# Fortio is built with Go >= 1.21: scripts/lib/go-toolchain.sh uses the Go that is
# here when it is new enough, else fetches one from the Go module proxy. Nothing
# outside this project's caches changes besides, at most, Debian's golang-go.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh
# shellcheck source=scripts/lib/apt.sh
source scripts/lib/apt.sh
# shellcheck source=benchmarks/lib.sh
source benchmarks/lib.sh # FORTIO_VERSION, fortio_find
# shellcheck source=scripts/lib/go-toolchain.sh
source scripts/lib/go-toolchain.sh

GO_MIN=1.21                        # fortio's go.mod says "go 1.21"
GO_TOOLCHAIN=1.22.12               # fetched when no go >= $GO_MIN is here

scripts/setup.sh --quick

if [[ -n "$(apt_missing iptables)" ]]; then
    step "installing iptables (Debian)"
    apt_install iptables
fi
ok "iptables"

# Fortio first: when it is there, Go does not matter.
if fortio=$(fortio_find); then
    ok "Fortio $FORTIO_VERSION ($fortio)"
    exit 0
fi

go_toolchain "$GO_MIN" "$GO_TOOLCHAIN" Fortio # sets go
ok "Go $(go_version "$go") ($go)"

step "installing Fortio $FORTIO_VERSION into $FORTIO_DIR (about a minute)"
mkdir -p "$FORTIO_DIR"
GOBIN=$FORTIO_DIR GOTOOLCHAIN=local "$go" install "fortio.org/fortio@v$FORTIO_VERSION"
fortio=$(fortio_find) || fail "go install did not leave fortio $FORTIO_VERSION in $FORTIO_DIR"
ok "Fortio $FORTIO_VERSION ($fortio)"
