# shellcheck shell=bash
# A Go toolchain for the few set-up steps that build Go programs (sourced; needs
# scripts/lib/ui.sh and scripts/lib/apt.sh): benchmarks/setup.sh (Fortio) and
# scripts/k8s/build.sh (Kubernetes and etcd).
#
# A Go that is already here is used when it is new enough; otherwise this fetches the
# Go toolchain from the Go module proxy as the go command itself does (module
# golang.org/toolchain, checked against the checksum database), using whatever older
# go is here to download it, or Debian's golang-go (1.19 on Debian 12) installed for
# that. Nothing outside this project's caches changes besides that Debian package.

GO_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/themis-mesh/go

# go_version GO: "1.22.12" for a go binary, nothing if it does not run.
go_version() { "$1" version 2> /dev/null | sed -n 's/^go version go\([0-9][0-9.]*\).*/\1/p'; }

# go_at_least MIN VERSION: whether VERSION (possibly empty) is >= MIN.
go_at_least() { [[ -n $2 && "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" == "$1" ]]; }

# go_toolchain MIN FETCH FOR: sets `go` to a go binary of version >= MIN: one on PATH,
# /usr/local/go, or the toolchain FETCH (e.g. 1.24.13) from this project's cache,
# fetched from the module proxy if none of those is new enough. FOR says what it is
# for, in the progress line.
go_toolchain() { # MIN FETCH FOR
    local min=$1 fetch=$2 for=$3 arch candidate bootstrap="" dir
    arch=$(dpkg --print-architecture)
    dir=$GO_CACHE/mod/golang.org/toolchain@v0.0.1-go$fetch.linux-$arch
    go=""
    for candidate in $(type -ap go) /usr/local/go/bin/go "$dir/bin/go"; do
        if go_at_least "$min" "$(go_version "$candidate")"; then go=$candidate && return 0; fi
    done

    step "fetching Go $fetch for $for from the Go module proxy (no Go >= $min here)"
    for candidate in $(type -ap go) /usr/local/go/bin/go /usr/lib/go/bin/go; do
        [[ -n "$(go_version "$candidate")" ]] && { bootstrap=$candidate && break; }
    done
    if [[ -z $bootstrap ]]; then
        echo "    no go at all: Debian's golang-go, only to download the toolchain with"
        apt_install golang-go
        bootstrap=/usr/lib/go/bin/go
    fi
    echo "    downloading golang.org/toolchain@v0.0.1-go$fetch.linux-$arch with $bootstrap (go $(go_version "$bootstrap"))"
    (cd / && GOMODCACHE=$GO_CACHE/mod GOPATH=$GO_CACHE/path GOFLAGS=-modcacherw GOTOOLCHAIN=local \
        "$bootstrap" mod download golang.org/toolchain@"v0.0.1-go$fetch.linux-$arch")
    # Module zips carry no file modes: mark the executables, as the go command does.
    chmod u+x "$dir"/bin/* "$dir"/pkg/tool/*/*
    go=$dir/bin/go
    go_at_least "$min" "$(go_version "$go")" || fail "the fetched $go does not run"
}

# go_build_setup BIN NEED_GB FOR GOCACHE_NAME: what a build of Go binaries into BIN
# does first (scripts/k8s/build.sh, build-istio.sh): refuse with less than 8 GB free
# (a build that fills the disk breaks every other job on the machine; it needs about
# NEED_GB), set `go` (>= $GO_MIN, fetching $GO_TOOLCHAIN if need be), and build with
# this project's own module and build caches (GOCACHE=$GO_CACHE/GOCACHE_NAME; nothing
# lands in ~/go), one package at a time, at the lowest priority (`quiet CMD...`): the
# machine has two cores and other builds run beside this one.
go_build_setup() { # BIN NEED_GB FOR GOCACHE_NAME
    local bin=$1 need=$2 for=$3 free_gb
    mkdir -p "$bin"
    free_gb=$(df --output=avail -BG "$bin" | tail -n1 | tr -dc 0-9)
    ((free_gb >= 8)) || fail "only ${free_gb} GB free under $bin: building needs about $need GB (see --help)"
    go_toolchain "$GO_MIN" "$GO_TOOLCHAIN" "$for" # sets go
    ok "Go $(go_version "$go") ($go)"
    export GOMODCACHE=$GO_CACHE/mod GOCACHE=$GO_CACHE/$4 GOPATH=$GO_CACHE/path
    export GOFLAGS="-modcacherw -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0
    export GOMAXPROCS=${GOMAXPROCS:-1}
}
quiet() { nice -n 19 ionice -c3 "$@"; }

