#!/usr/bin/env bash
# Builds Istio's control plane and proxy agent (istiod's pilot-discovery, pilot-agent,
# istioctl) from the Go module proxy, into a cache: a second run takes a second.
#
#   scripts/k8s/build-istio.sh [--print-bin]
#
# istio.io/istio's go.mod has no replace directives, so `go install pkg@version` builds
# each binary as any Go dependency is built. The install charts are embedded in istioctl.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh
# shellcheck source=scripts/lib/apt.sh
source scripts/lib/apt.sh
# shellcheck source=scripts/lib/go-toolchain.sh
source scripts/lib/go-toolchain.sh
# shellcheck source=scripts/k8s/versions.sh
source scripts/k8s/versions.sh # ISTIO_VERSION, ISTIO_BIN, ISTIO_BINARIES

GO_MIN=1.26          # istio.io/istio's go.mod at $ISTIO_VERSION says "go 1.26.0"
GO_TOOLCHAIN=1.26.8  # fetched when no go >= $GO_MIN is here

usage() {
    cat << USAGE
usage: scripts/k8s/build-istio.sh [--print-bin]

Builds Istio $ISTIO_VERSION (${ISTIO_BINARIES[*]}, and takes pilot-agent's Envoy
bootstrap template from its source) with Go from the Go module proxy
(Go >= $GO_MIN: the one here, or fetched), into
  $ISTIO_BIN
Nothing is built when all of them are there: a second run takes a second. Cold: about
20-30 minutes on 2 busy cores (under nice and ionice, one package at a time), and about
6 GB of disk while building (the build cache is removed when done unless
THEMIS_K8S_KEEP_GOCACHE=1). It refuses to start with less than 8 GB free.

  --print-bin   only print the binaries' directory (exit 1 if a binary is missing)
USAGE
}

have_all() {
    local b
    for b in "${ISTIO_BINARIES[@]}"; do [[ -x $ISTIO_BIN/$b ]] || return 1; done
    [[ -s $ISTIO_BIN/envoy_bootstrap.json ]]
}

case ${1:-} in
    -h | --help) usage && exit 0 ;;
    --print-bin) have_all && echo "$ISTIO_BIN" && exit 0 || exit 1 ;;
    "") ;;
    *) usage >&2 && exit 2 ;;
esac

if have_all; then
    ok "Istio $ISTIO_VERSION ($ISTIO_BIN)"
    exit 0
fi

go_build_setup "$ISTIO_BIN" 6 "Istio" istio-build # sets go, the caches, quiet

# What `istioctl version` and istiod report; istioctl compares it with the images' tag.
ldflags="-s -w"
for kv in buildVersion=$ISTIO_TAG buildGitRevision=${ISTIO_VERSION##*-} buildStatus=Archive buildTag=$ISTIO_TAG; do
    ldflags+=" -X istio.io/istio/pkg/version.$kv"
done

work=$(dirname "$ISTIO_BIN")/gobin
mkdir -p "$work"
for i in "${!ISTIO_BINARIES[@]}"; do
    b=${ISTIO_BINARIES[$i]} p=${ISTIO_PACKAGES[$i]}
    [[ -x $ISTIO_BIN/$b ]] && { ok "$b (built before)"; continue; }
    step "building $b (go install $p@$ISTIO_VERSION)"
    start=$SECONDS
    GOBIN=$work quiet "$go" install -p 1 -trimpath -ldflags "$ldflags" "$p@$ISTIO_VERSION" \
        > "$work/$b.log" 2>&1 || { tail -n 20 "$work/$b.log" >&2; fail "go install of $b failed (log: $work/$b.log)"; }
    mv "$work/$(basename "$p")" "$ISTIO_BIN/$b"
    ok "$b in $((SECONDS - start)) s"
done
# pilot-agent renders Envoy's bootstrap from this template (the proxy image's
# /var/lib/istio/envoy/envoy_bootstrap_tmpl.json, as Istio's Dockerfile.proxyv2 puts it).
if [[ ! -s $ISTIO_BIN/envoy_bootstrap.json ]]; then
    source_dir=$(quiet "$go" mod download -json "istio.io/istio@$ISTIO_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -s $source_dir/tools/packaging/common/envoy_bootstrap.json ]] ||
        fail "istio.io/istio@$ISTIO_VERSION has no tools/packaging/common/envoy_bootstrap.json"
    cp "$source_dir/tools/packaging/common/envoy_bootstrap.json" "$ISTIO_BIN/envoy_bootstrap.json"
    ok "Envoy's bootstrap template ($ISTIO_BIN/envoy_bootstrap.json)"
fi
have_all || fail "Istio's binaries are not all in $ISTIO_BIN"
[[ ${THEMIS_K8S_KEEP_GOCACHE:-} == 1 ]] || rm -rf "$GOCACHE"
ok "Istio $ISTIO_VERSION ($ISTIO_BIN)"
