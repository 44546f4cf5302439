#!/usr/bin/env bash
# What the benchmarks need beyond the demo's set-up: scripts/setup.sh --quick, then
# iptables (benchmarks/ebpf: capture against iptables REDIRECT) and Fortio (the load
# generator of benchmarks/envoy and benchmarks/ebpf). benchmarks/*/run.sh call this
# first; a second run takes a second and prints "ok" lines.
#
# Fortio is built with Go >= 1.21. A Go that is already here is used when it is new
# enough; otherwise this fetches the Go toolchain from the Go module proxy as the go
# command itself does (module golang.org/toolchain, checked against the checksum
# database), using whatever older go is here to download it, or Debian's golang-go
# (1.19 on Debian 12) installed for that. Nothing outside this project's caches changes
# besides that Debian package.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh
# shellcheck source=scripts/lib/apt.sh
source scripts/lib/apt.sh
# shellcheck source=benchmarks/lib.sh
source benchmarks/lib.sh # FORTIO_VERSION, fortio_find

GO_MIN=1.21                        # fortio's go.mod says "go 1.21"
GO_TOOLCHAIN=1.22.12               # fetched when no go >= $GO_MIN is here
GO_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/themis-mesh/go

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

# go_version GO: "1.22.12" for a go binary, nothing if it does not run.
go_version() { "$1" version 2> /dev/null | sed -n 's/^go version go\([0-9][0-9.]*\).*/\1/p'; }
new_enough() { [[ -n $1 && "$(printf '%s\n%s\n' "$GO_MIN" "$1" | sort -V | head -n1)" == "$GO_MIN" ]]; }

arch=$(dpkg --print-architecture)
toolchain_dir=$GO_CACHE/mod/golang.org/toolchain@v0.0.1-go$GO_TOOLCHAIN.linux-$arch
go=""
for candidate in $(type -ap go) /usr/local/go/bin/go "$toolchain_dir/bin/go"; do
    if new_enough "$(go_version "$candidate")"; then go=$candidate && break; fi
done

if [[ -z $go ]]; then
    step "fetching Go $GO_TOOLCHAIN for Fortio from the Go module proxy (no Go >= $GO_MIN here)"
    bootstrap=""
    for candidate in $(type -ap go) /usr/local/go/bin/go /usr/lib/go/bin/go; do
        [[ -n "$(go_version "$candidate")" ]] && { bootstrap=$candidate && break; }
    done
    if [[ -z $bootstrap ]]; then
        echo "    no go at all: Debian's golang-go, only to download the toolchain with"
        apt_install golang-go
        bootstrap=/usr/lib/go/bin/go
    fi
    echo "    downloading golang.org/toolchain@v0.0.1-go$GO_TOOLCHAIN.linux-$arch with $bootstrap (go $(go_version "$bootstrap"))"
    (cd / && GOMODCACHE=$GO_CACHE/mod GOPATH=$GO_CACHE/path GOFLAGS=-modcacherw GOTOOLCHAIN=local \
        "$bootstrap" mod download golang.org/toolchain@"v0.0.1-go$GO_TOOLCHAIN.linux-$arch")
    # Module zips carry no file modes: mark the executables, as the go command does.
    chmod u+x "$toolchain_dir"/bin/* "$toolchain_dir"/pkg/tool/*/*
    go=$toolchain_dir/bin/go
    new_enough "$(go_version "$go")" || fail "the fetched $go does not run"
fi
ok "Go $(go_version "$go") ($go)"

step "installing Fortio $FORTIO_VERSION into $FORTIO_DIR (about a minute)"
mkdir -p "$FORTIO_DIR"
GOBIN=$FORTIO_DIR GOTOOLCHAIN=local "$go" install "fortio.org/fortio@v$FORTIO_VERSION"
fortio=$(fortio_find) || fail "go install did not leave fortio $FORTIO_VERSION in $FORTIO_DIR"
ok "Fortio $FORTIO_VERSION ($fortio)"
