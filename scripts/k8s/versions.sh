# shellcheck shell=bash disable=SC2034 # all used by the scripts that source this
# The versions of the test cluster and where their binaries are cached (sourced by
# scripts/k8s/build.sh and scripts/k8s/cluster.sh).

# The newest 1.33 patch the Go module proxy serves. 1.33, not 1.35+: kubelet >= 1.35
# refuses cgroup v1, and these machines have hybrid cgroups (v1 controllers).
K8S_VERSION=v1.33.13
# The etcd k8s.io/kubernetes v1.33.13's go.mod requires (go.etcd.io/etcd/server/v3).
ETCD_VERSION=v3.5.21
# The cluster's DNS; its go.mod has no replace directives, so `go install` builds it.
COREDNS_VERSION=v1.12.4

K8S_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/themis-mesh/k8s/$K8S_VERSION
K8S_BIN=$K8S_CACHE/bin

K8S_BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
K8S_PACKAGES=(
    go.etcd.io/etcd/server/v3
    k8s.io/kubernetes/cmd/kube-apiserver
    k8s.io/kubernetes/cmd/kube-controller-manager
    k8s.io/kubernetes/cmd/kube-scheduler
    k8s.io/kubernetes/cmd/kubelet
    k8s.io/kubernetes/cmd/kube-proxy
    k8s.io/kubernetes/cmd/kubectl
)

# Istio's control plane, built from source (scripts/k8s/build-istio.sh). istio.io/istio
# has no semver tags on the module proxy: the newest pseudo-version of its main branch
# (2026-08-27; go.mod: go 1.26.0, no replace directives). ISTIO_TAG is what the binaries
# report and the images' tag (its VERSION file says 1.31).
ISTIO_VERSION=v0.0.0-20260827124520-eed52ebb66ad
ISTIO_TAG=1.31-dev-eed52ebb
ISTIO_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/themis-mesh/istio/$ISTIO_VERSION
ISTIO_BIN=$ISTIO_CACHE/bin
ISTIO_BINARIES=(pilot-discovery pilot-agent istioctl)
ISTIO_PACKAGES=(
    istio.io/istio/pilot/cmd/pilot-discovery
    istio.io/istio/pilot/cmd/pilot-agent
    istio.io/istio/istioctl/cmd/istioctl
)
