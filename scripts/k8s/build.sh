#!/usr/bin/env bash
# Builds the Kubernetes and etcd binaries of the test cluster (scripts/k8s/cluster.sh)
# from the Go module proxy, into a cache: a second run takes a second.
#
#   scripts/k8s/build.sh [--print-bin]
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces its 31 staging modules
# (k8s.io/api, k8s.io/client-go, ...) with ./staging directories, and requires them at
# v0.0.0. A small wrapper module requires k8s.io/kubernetes and replaces each staging
# module with its released version (v1.33.N -> v0.33.N). Kubernetes 1.33 already
# requires etcd 3.5.x (server included, for its integration tests), so the same module
# builds the etcd server at the version Kubernetes was released with.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh
# shellcheck source=scripts/lib/apt.sh
source scripts/lib/apt.sh
# shellcheck source=scripts/lib/go-toolchain.sh
source scripts/lib/go-toolchain.sh
# shellcheck source=scripts/k8s/versions.sh
source scripts/k8s/versions.sh # K8S_VERSION, ETCD_VERSION, K8S_BIN, K8S_BINARIES

GO_MIN=1.24          # k8s.io/kubernetes v1.33's go.mod says "go 1.24.0"
GO_TOOLCHAIN=1.24.13 # fetched when no go >= $GO_MIN is here

usage() {
    cat << EOF
usage: scripts/k8s/build.sh [--print-bin]

Builds Kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler,
kubelet, kube-proxy, kubectl), etcd $ETCD_VERSION and CoreDNS $COREDNS_VERSION with Go
from the Go module proxy (Go >= $GO_MIN: the one here, or fetched), into
  $K8S_BIN
Nothing is built when all of them are there with the right version: a second run
takes a second. Cold: about 15-20 minutes on 2 busy cores (under nice and ionice, one
package at a time), and 7 GB of disk while building: the Go module cache (2 GB, kept),
the build cache (4 GB, removed when done unless THEMIS_K8S_KEEP_GOCACHE=1), the
binaries (0.55 GB). It refuses to start with less than 8 GB free.

  --print-bin   only print the binaries' directory (exit 1 if a binary is missing)
EOF
}

case ${1:-} in
    -h | --help) usage && exit 0 ;;
    --print-bin)
        for b in "${K8S_BINARIES[@]}"; do [[ -x $K8S_BIN/$b ]] || exit 1; done
        echo "$K8S_BIN" && exit 0
        ;;
    "") ;;
    *) usage >&2 && exit 2 ;;
esac

# have_all: whether every binary is in the cache and reports the version it should.
have_all() {
    local b
    for b in "${K8S_BINARIES[@]}"; do [[ -x $K8S_BIN/$b ]] || return 1; done
    # Each answer is read whole before it is matched: `cmd | grep -q` under pipefail
    # fails at random when grep leaves at its first match and etcd or CoreDNS (one
    # write per line) dies of SIGPIPE writing the next.
    [[ $'\n'$("$K8S_BIN/kubelet" --version 2> /dev/null)$'\n' == *$'\n'"Kubernetes $K8S_VERSION"$'\n'* ]] &&
        [[ $'\n'$("$K8S_BIN/etcd" --version 2> /dev/null)$'\n' == *$'\n'"etcd Version: ${ETCD_VERSION#v}"$'\n'* ]] &&
        [[ $'\n'$("$K8S_BIN/coredns" -version 2> /dev/null)$'\n' == *$'\n'"CoreDNS-${COREDNS_VERSION#v}"$'\n'* ]]
}

# missing: whether some of the wrapper module's binaries are not built yet.
missing() {
    local b
    for b in "${K8S_BINARIES[@]}"; do [[ -x $K8S_BIN/$b ]] || return 0; done
    return 1
}

if have_all; then
    ok "Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, CoreDNS $COREDNS_VERSION ($K8S_BIN)"
    exit 0
fi

go_build_setup "$K8S_BIN" 7 "Kubernetes" build # sets go, the caches, quiet

# The build cache is 4 GB after a cold build and the binaries are all that is needed
# (the disk of these machines is sometimes nearly full): removed once they are built.
# THEMIS_K8S_KEEP_GOCACHE=1 keeps it. The module cache (2 GB) stays: it makes a rebuild
# need no network.
finish() {
    have_all || fail "the binaries in $K8S_BIN do not report Kubernetes $K8S_VERSION / etcd $ETCD_VERSION / CoreDNS $COREDNS_VERSION: remove them and run again"
    [[ ${THEMIS_K8S_KEEP_GOCACHE:-} == 1 ]] || rm -rf "$GOCACHE"
    ok "Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, CoreDNS $COREDNS_VERSION ($K8S_BIN)"
    exit 0
}

work=$(dirname "$K8S_BIN")/module
mkdir -p "$work" "$K8S_BIN"
cd "$work"

# CoreDNS (the cluster's DNS, as kubeadm installs it) is an ordinary module: go install.
if [[ ! -x $K8S_BIN/coredns ]]; then
    step "building coredns (go install github.com/coredns/coredns@$COREDNS_VERSION)"
    start=$SECONDS
    GOBIN=$work/gobin quiet "$go" install -p 1 -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION" \
        > coredns.log 2>&1 || { tail -n 20 coredns.log >&2; fail "go install of CoreDNS failed (log: $work/coredns.log)"; }
    mv "$work/gobin/coredns" "$K8S_BIN/coredns"
    ok "coredns in $((SECONDS - start)) s"
fi
missing || finish

step "downloading k8s.io/kubernetes@$K8S_VERSION's go.mod (its staging modules)"
kube_mod=$(quiet "$go" mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
[[ -f $kube_mod ]] || fail "go mod download k8s.io/kubernetes@$K8S_VERSION gave no go.mod"
mapfile -t staging < <(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$kube_mod")
((${#staging[@]} >= 30)) || fail "found only ${#staging[@]} staging modules in $kube_mod"
ok "${#staging[@]} staging modules, each replaced by its release v0.${K8S_VERSION#v1.}"

step "writing the wrapper module ($work)"
staging_version=v0.${K8S_VERSION#v1.}
{
    echo "// Generated by scripts/k8s/build.sh: builds Kubernetes $K8S_VERSION and etcd $ETCD_VERSION."
    echo "module themis.local/k8s-build"
    echo
    echo "go $GO_MIN"
    echo
    echo "require ("
    echo "	k8s.io/kubernetes $K8S_VERSION"
    echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo ")"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do echo "	$m => $m $staging_version"; done
    echo ")"
} > go.mod
# The packages to build, named in a file so that `go mod tidy` keeps their dependencies.
{
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for p in "${K8S_PACKAGES[@]}"; do echo "	_ \"$p\""; done
    echo ")"
} > tools.go
# tidy records the sums of everything those packages import (for every platform).
step "resolving the module graph (go mod tidy: downloads the sources, a few minutes cold)"
quiet "$go" mod tidy > tidy.log 2>&1 || { tail -n 20 tidy.log >&2; fail "go mod tidy failed (log: $work/tidy.log)"; }
grep -q "k8s.io/kubernetes $K8S_VERSION" go.mod || fail "go mod tidy dropped k8s.io/kubernetes $K8S_VERSION (see $work/go.mod)"
grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION" go.mod ||
    fail "the module graph chose another etcd than $ETCD_VERSION: $(grep 'etcd/server/v3' go.mod)"

# What `kubelet --version`, `kubectl version` and the apiserver's /version report:
# without these they say v0.0.0-master. The tree state is "archive": built from the
# module zip, with no git commit to name.
build_date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "${kube_mod%.mod}.info")
minor=${K8S_VERSION#v1.} && minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=$build_date"
done

for i in "${!K8S_BINARIES[@]}"; do
    b=${K8S_BINARIES[$i]} p=${K8S_PACKAGES[$i]}
    [[ -x $K8S_BIN/$b ]] && { ok "$b (built before)"; continue; }
    step "building $b ($p)"
    start=$SECONDS
    quiet "$go" build -p 1 -trimpath -ldflags "$ldflags" -o "$K8S_BIN/$b.new" "$p"
    mv "$K8S_BIN/$b.new" "$K8S_BIN/$b"
    ok "$b in $((SECONDS - start)) s"
done

finish
