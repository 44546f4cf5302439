#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, with nothing pulled and no
# traffic leaving it. See --help and docs/KUBERNETES.md ("The test cluster").
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh
# shellcheck source=scripts/lib/apt.sh
source scripts/lib/apt.sh
# shellcheck source=scripts/lib/netns.sh
source scripts/lib/netns.sh # spawn, recorded_pids, stop_pids, retry_while, running
# shellcheck source=scripts/k8s/versions.sh
source scripts/k8s/versions.sh
# shellcheck source=scripts/k8s/oci-image.sh
source scripts/k8s/oci-image.sh

RUN=${THEMIS_K8S_RUN:-/run/themis-k8s} # everything of a running cluster, removed by down
PID_FILE=$RUN/pids                     # "PID START NAME" of each daemon (scripts/lib/netns.sh)
NS=themis-k8s                          # the node's network namespace
HOST_IF=themis-k8s                     # the host's end of the veth to the node
HOST_IP=10.250.0.1 NODE_IP=10.250.0.2  # the /30 between them
POD_CIDR=10.244.0.0/16 NODE_POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/12 API_SERVICE_IP=10.96.0.1 DNS_SERVICE_IP=10.96.0.10
NODE=themis-node
CGROUP_ROOT=/themis-k8s # the kubelet's cgroup root, in every hierarchy: what down removes
PAUSE_IMAGE=localhost/themis/pause:3.10
BUSYBOX_IMAGE=localhost/themis/busybox:1
COREDNS_IMAGE=localhost/themis/coredns:${COREDNS_VERSION#v}
# What the kubelet sets on the whole machine (not only on the node): saved by up,
# restored by down. It offers no way to leave them alone (protectKernelDefaults fails).
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
# Paths outside $RUN that containerd and the kubelet create whatever they are told
# (shim sockets, CNI results, the device-plugin socket directory, container log links);
# down removes those up found missing. /run/netns (ip netns) is only removed if empty.
# Themis's DaemonSet (deploy/) keeps its state, socket and eBPF pins on the host's paths.
OUTSIDE=(/run/containerd /var/lib/cni /var/lib/kubelet /var/log/containers /usr/libexec/kubernetes /run/netns
    /var/lib/themis /var/run/themis /sys/fs/bpf/themis)

usage() {
    cat << EOF
usage: scripts/k8s/cluster.sh up|down|status|smoke|kubectl ARGS...|env

  up       builds the binaries if needed (scripts/k8s/build.sh), installs Debian's
           containerd, runc and CNI plugins if missing, and starts a one-node
           Kubernetes $K8S_VERSION cluster; waits until the node is Ready
  smoke    on a running cluster: a busybox web pod behind a ClusterIP Service, resolved
           by name and called from another pod; prints where a container sits in the
           cgroup v2 tree
  status   what runs (each daemon by its recorded pid) and the node's state
  down     stops everything by pid and removes all up made: mounts, the node's
           network namespace (its bridge and iptables rules go with it), routes,
           cgroups, $RUN; restores the sysctls the kubelet changed
  import TAR...
           imports image archives (scripts/k8s/images.sh) into the node's containerd
  kubectl  kubectl against the cluster (admin)
  env      prints export KUBECONFIG=... for your shell

The node is the network namespace $NS ($NODE_IP, veth $HOST_IF on the host side,
$HOST_IP). All daemons run in it: etcd on its loopback, the API server on
https://$NODE_IP:6443 (reachable from the host through the veth only), containerd,
the kubelet and kube-proxy (iptables mode). Pods get $NODE_POD_CIDR on a CNI bridge
inside it (the node's .spec.podCIDR, allocated by the controller manager: the range
the mesh operator grants the node with `themis node range`); Services $SERVICE_CIDR. The host has blackhole routes for $POD_CIDR and
$SERVICE_CIDR, and the node no default route: nothing can leave the machine.
Cluster DNS: CoreDNS (built here) at $DNS_SERVICE_IP, serving cluster.local only, with no
upstream: other names do not resolve. Images are built here (pause, busybox, coredns)
and imported into containerd; nothing is pulled. Needs root.
Run directory: \$THEMIS_K8S_RUN (default /run/themis-k8s).
EOF
}

# --- small helpers -----------------------------------------------------------------

kctl() { "$K8S_BIN/kubectl" --kubeconfig "$RUN/pki/admin.kubeconfig" "$@"; }
node_ctr() { ctr --address "$RUN/containerd/containerd.sock" --namespace k8s.io "$@"; }
in_node() { ip netns exec "$NS" "$@"; }

# The pid of daemon NAME (recorded in $PID_FILE) if it still runs. Not a zombie: pid 1
# on these machines (not an init) reaps the orphans it inherits late, so a daemon that
# died can stay in the process table for a while.
daemon_pid() {
    local pid
    for pid in $(recorded_pids "$1"); do running "$pid" && echo "$pid" && return 0; done
    return 0
}

# Starts a daemon in the node's network namespace (it keeps the host's mounts and
# cgroups), logging to $RUN/logs/NAME.log.
start_daemon() { # NAME CMD...
    local name=$1
    shift
    spawn "$name" "$NS" - "$RUN/logs/$name.log" "$@"
}

# Waits up to SECONDS for CMD to succeed while daemon NAME runs; on failure prints the
# end of its log and exits.
await() { # NAME SECONDS WHAT CMD...
    local name=$1 seconds=$2 what=$3 pid
    shift 3
    pid=$(daemon_pid "$name")
    if ! retry_while "$pid" $((seconds * 5)) "$@"; then
        tail -n 25 "$RUN/logs/$name.log" | indent >&2
        fail "$name: $what did not happen within $seconds s (log: $RUN/logs/$name.log)"
    fi
}

# --- certificates (openssl, ECDSA P-256) --------------------------------------------

# Issues PKI/NAME.{key,crt} for subject SUBJ signed by the cluster CA, with SANs
# (e.g. "DNS:x,IP:1.2.3.4") and the key usage of a server ("server") or client.
issue() { # NAME SUBJ USAGE [SANS]
    local name=$1 subj=$2 usage=$3 sans=${4:-} pki=$RUN/pki ext
    ext=$pki/$name.ext
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        if [[ $usage == server ]]; then echo "extendedKeyUsage=serverAuth"; else echo "extendedKeyUsage=clientAuth"; fi
        if [[ -n $sans ]]; then echo "subjectAltName=$sans"; fi
    } > "$ext"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subj" \
        -keyout "$pki/$name.key" -out "$pki/$name.csr" 2> /dev/null
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -days 30 -extfile "$ext" -out "$pki/$name.crt" 2> /dev/null
    rm -f "$pki/$name.csr" "$ext"
}

# Writes PKI/NAME.kubeconfig: the client certificate NAME against the API server.
kubeconfig() { # NAME
    local pki=$RUN/pki
    cat > "$pki/$1.kubeconfig" << EOF
apiVersion: v1
kind: Config
clusters:
- name: themis
  cluster: {server: "https://$NODE_IP:6443", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$pki/$1.crt", client-key: "$pki/$1.key"}
contexts:
- name: themis
  context: {cluster: themis, user: $1}
current-context: themis
EOF
}

# The cluster CA, a certificate per component, the service-account signing key.
make_pki() {
    local pki=$RUN/pki
    mkdir -p "$pki" && chmod 700 "$pki"
    openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
        -subj "/CN=themis-k8s-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt" 2> /dev/null
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/sa.key" 2> /dev/null
    openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2> /dev/null
    issue apiserver "/CN=kube-apiserver" server \
        "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:$NODE_IP,IP:$API_SERVICE_IP,IP:127.0.0.1"
    issue kubelet-serving "/CN=$NODE" server "DNS:$NODE,IP:$NODE_IP"
    issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client
    issue admin "/O=system:masters/CN=themis-admin" client
    issue controller-manager "/CN=system:kube-controller-manager" client
    issue scheduler "/CN=system:kube-scheduler" client
    issue kubelet "/O=system:nodes/CN=system:node:$NODE" client
    issue kube-proxy "/CN=system:kube-proxy" client
    local c
    for c in admin controller-manager scheduler kubelet kube-proxy; do kubeconfig "$c"; done
}

# --- images (no registry) -------------------------------------------------------------

# Builds the pause, busybox and CoreDNS images as OCI archives under $RUN/images.
make_images() {
    local dir=$RUN/images root applet lib
    mkdir -p "$dir/pause/rootfs" "$dir/busybox/rootfs/bin" "$dir/busybox/rootfs/etc" "$dir/busybox/rootfs/tmp"
    gcc -static -Os -s -o "$dir/pause/rootfs/pause" scripts/k8s/pause.c
    oci_archive "$PAUSE_IMAGE" "$dir/pause/rootfs" "$dir/pause.tar" /pause

    # Debian's busybox-static: one static binary, an applet per symlink.
    root=$dir/busybox/rootfs
    cp /bin/busybox "$root/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [[ $applet == busybox ]] || ln -sf busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$root/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\n' > "$root/etc/group"
    chmod 1777 "$root/tmp"
    # glibc's getent (with the libraries it loads) resolves names as most programs do,
    # through nsswitch and the pod's /etc/resolv.conf.
    mkdir -p "$root/usr/bin"
    cp /usr/bin/getent "$root/usr/bin/getent"
    for lib in $(ldd /usr/bin/getent | grep -o '/[^ ]*'); do
        mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib"
    done
    echo "hosts: files dns" > "$root/etc/nsswitch.conf"
    oci_archive "$BUSYBOX_IMAGE" "$root" "$dir/busybox.tar" /bin/sh

    # CoreDNS: one static binary (scripts/k8s/build.sh).
    mkdir -p "$dir/coredns/rootfs"
    cp "$K8S_BIN/coredns" "$dir/coredns/rootfs/coredns"
    oci_archive "$COREDNS_IMAGE" "$dir/coredns/rootfs" "$dir/coredns.tar" /coredns
}

# --- the node's network ---------------------------------------------------------------

# The node namespace with a veth to the host, and routes that can send nothing out.
net_up() {
    ip netns add "$NS"
    ip link add "$HOST_IF" type veth peer name eth0 netns "$NS"
    ip addr add "$HOST_IP/30" dev "$HOST_IF"
    ip link set "$HOST_IF" up
    ip -n "$NS" link set lo up
    ip -n "$NS" addr add "$NODE_IP/30" dev eth0
    ip -n "$NS" link set eth0 up
    # The host sends nothing for pods or Services out of its own default route.
    ip route add blackhole "$POD_CIDR"
    ip route add blackhole "$SERVICE_CIDR"
    # The node routes between its pods (and to the host's end of the veth); there is
    # no default route: anything else is unreachable, so nothing leaves.
    ip -n "$NS" route add unreachable default
    # Host-network pods (Themis's DaemonSet) reach Services from the node itself: the
    # route lookup comes before kube-proxy's DNAT, so Services need a route. Towards
    # the host, whose blackhole drops whatever no rule rewrote.
    ip -n "$NS" route add "$SERVICE_CIDR" via "$HOST_IP"
    in_node sysctl -qw net.ipv4.ip_forward=1
    # Pod-to-Service-to-pod on the same bridge: the reply must pass iptables too.
    in_node sysctl -qw net.bridge.bridge-nf-call-iptables=1
}

net_down() {
    ip route del blackhole "$POD_CIDR" 2> /dev/null || true
    ip route del blackhole "$SERVICE_CIDR" 2> /dev/null || true
    ip netns del "$NS" 2> /dev/null || true # its veth end, bridge, iptables rules go with it
    ip link del "$HOST_IF" 2> /dev/null || true
}

# --- configuration files ------------------------------------------------------------

write_configs() {
    mkdir -p "$RUN/cni/net.d" "$RUN/containerd" "$RUN/kubelet" "$RUN/pod-logs"
    cat > "$RUN/cni/net.d/10-themis.conflist" << EOF
{
  "cniVersion": "1.0.0",
  "name": "themis-pods",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$RUN/cni/ipam",
              "ranges": [[{"subnet": "$NODE_POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
    # containerd: every directory under $RUN; the sandbox image is ours and never pulled.
    cat > "$RUN/containerd/config.toml" << EOF
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$RUN/containerd/containerd.sock"
[ttrpc]
  address = "$RUN/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$RUN/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  netns_mounts_under_state_dir = true
  # Root here has no CAP_SYS_RESOURCE: runc cannot lower a container's oom_score_adj
  # (the kubelet asks -998 for sandboxes); never below containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUN/containerd/runc"
EOF
    # The kubelet: cgroupfs (no systemd here), our own cgroup root, nothing pulled,
    # no image garbage collection or disk-pressure eviction (the disk of these
    # machines is often more than 85 % full, and our images exist nowhere else).
    cat > "$RUN/kubelet/config.yaml" << EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$RUN/containerd/containerd.sock
address: $NODE_IP
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $RUN/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $RUN/pki/kubelet-serving.crt
tlsPrivateKeyFile: $RUN/pki/kubelet-serving.key
clusterDomain: cluster.local
clusterDNS: [$DNS_SERVICE_IP]
resolvConf: $RUN/kubelet/resolv.conf
failSwapOn: false
podLogsDir: $RUN/pod-logs
volumePluginDir: $RUN/kubelet/volume-plugins
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1Gi, imagefs.available: 1Gi}
serializeImagePulls: false
EOF
    # The node's resolv.conf, for pods of dnsPolicy Default (CoreDNS itself): no name
    # server. None is reachable from here, and a query must not leave.
    echo "options ndots:1" > "$RUN/kubelet/resolv.conf"
    cat > "$RUN/kube-proxy.yaml" << EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection: {kubeconfig: $RUN/pki/kube-proxy.kubeconfig}
# The conntrack table size and timeouts are machine-wide: leave them as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

# --- up -------------------------------------------------------------------------------

up() {
    ((EUID == 0)) || fail "scripts/k8s/cluster.sh up needs root"
    if [[ -f $PID_FILE && -n "$(daemon_pid '*')" ]]; then
        ok "the cluster is already up ($RUN); scripts/k8s/cluster.sh down first for a fresh one"
        return 0
    fi
    [[ -e /run/netns/$NS || -e $RUN ]] && fail "a cluster was left half up: scripts/k8s/cluster.sh down first"
    local t0=$SECONDS

    scripts/k8s/build.sh
    local missing=()
    mapfile -t missing < <(apt_missing containerd runc containernetworking-plugins busybox-static iptables conntrack)
    if ((${#missing[@]})); then
        step "installing ${missing[*]} (Debian)"
        # On one line: apt_missing prints one package a line, and a newline in the
        # script given to bash -c would run each further package as a command.
        nice -n 19 ionice -c3 bash -c "$(declare -f apt_install fail); apt_install ${missing[*]}"
    fi
    command -v gcc > /dev/null || fail "gcc is needed for the pause image: apt-get install gcc libc6-dev"
    ok "containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), CNI plugins"

    step "the node: network namespace $NS ($NODE_IP), pods $NODE_POD_CIDR, Services $SERVICE_CIDR"
    mkdir -p "$RUN/logs"
    : > "$PID_FILE"
    local p
    for p in "${OUTSIDE[@]}"; do [[ -e $p ]] && echo "$p"; done > "$RUN/preexisting"
    for p in "${SYSCTLS[@]}"; do echo "$p=$(sysctl -n "$p")"; done > "$RUN/sysctls"
    # The kubelet needs shared mount propagation (mount propagation of volumes).
    findmnt -no PROPAGATION / > "$RUN/propagation"
    mount --make-rshared /
    net_up
    cgroups_up
    write_configs

    step "certificates (openssl) and images (pause from gcc, busybox; no registry)"
    make_pki
    make_images

    step "containerd (run directory $RUN/containerd)"
    start_daemon containerd containerd --config "$RUN/containerd/config.toml"
    await containerd 20 "its socket answering" node_ctr version
    node_ctr images import "$RUN/images/pause.tar" > /dev/null
    node_ctr images import "$RUN/images/busybox.tar" > /dev/null
    node_ctr images import "$RUN/images/coredns.tar" > /dev/null
    ok "images: $(node_ctr images ls -q | grep '^localhost/' | paste -sd' ')"

    step "etcd $ETCD_VERSION and kube-apiserver $K8S_VERSION"
    start_daemon etcd "$K8S_BIN/etcd" --name "$NODE" --data-dir "$RUN/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster "$NODE=http://127.0.0.1:2380" --log-level warn
    local pki=$RUN/pki
    start_daemon kube-apiserver "$K8S_BIN/kube-apiserver" \
        --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port 6443 \
        --etcd-servers http://127.0.0.1:2379 \
        --service-cluster-ip-range "$SERVICE_CIDR" \
        --client-ca-file "$pki/ca.crt" \
        --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
        --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority "$pki/ca.crt" \
        --kubelet-preferred-address-types InternalIP \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
        --authorization-mode Node,RBAC --allow-privileged=true \
        --enable-admission-plugins NodeRestriction
    await kube-apiserver 120 "/readyz" kctl get --raw /readyz

    step "kube-controller-manager, kube-scheduler"
    start_daemon kube-controller-manager "$K8S_BIN/kube-controller-manager" \
        --kubeconfig "$pki/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$pki/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$pki/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --leader-elect=false \
        --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
        --use-service-account-credentials \
        --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
        --service-cluster-ip-range "$SERVICE_CIDR" --cluster-cidr "$POD_CIDR" \
        --allocate-node-cidrs=true --node-cidr-mask-size=24
    start_daemon kube-scheduler "$K8S_BIN/kube-scheduler" \
        --kubeconfig "$pki/scheduler.kubeconfig" \
        --authentication-kubeconfig "$pki/scheduler.kubeconfig" \
        --authorization-kubeconfig "$pki/scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --leader-elect=false

    step "kubelet and kube-proxy (iptables mode)"
    start_daemon kubelet "$K8S_BIN/kubelet" --config "$RUN/kubelet/config.yaml" \
        --kubeconfig "$pki/kubelet.kubeconfig" --root-dir "$RUN/kubelet/root" \
        --hostname-override "$NODE" --node-ip "$NODE_IP"
    start_daemon kube-proxy "$K8S_BIN/kube-proxy" --config "$RUN/kube-proxy.yaml"
    await kubelet 120 "node $NODE Ready" node_ready
    ok "node $NODE Ready"
    # Pods can be created once the controller-manager has made the default namespace's
    # service account.
    await kube-controller-manager 60 "the default service account" kctl get serviceaccount default
    step "CoreDNS $COREDNS_VERSION (Service kube-dns, $DNS_SERVICE_IP): cluster.local only, no upstream"
    coredns_manifest | kctl apply -f - > /dev/null
    kctl -n kube-system rollout status deployment/coredns --timeout=90s > /dev/null ||
        fail "CoreDNS did not become ready: scripts/k8s/cluster.sh kubectl -n kube-system describe pods"
    ok "the cluster is up in $((SECONDS - t0)) s"
    echo "    kubectl: scripts/k8s/cluster.sh kubectl get pods -A   (or: eval \$(scripts/k8s/cluster.sh env))"
}

# CoreDNS as kubeadm deploys it, minus `forward`: names outside cluster.local are
# refused rather than sent anywhere.
coredns_manifest() {
    cat << EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
        reload
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      priorityClassName: system-cluster-critical
      containers:
      - name: coredns
        image: $COREDNS_IMAGE
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
        livenessProbe: {httpGet: {path: /health, port: 8080}, periodSeconds: 10}
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_SERVICE_IP
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
EOF
}

node_ready() {
    [[ "$(kctl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

# --- down -----------------------------------------------------------------------------

down() {
    ((EUID == 0)) || fail "scripts/k8s/cluster.sh down needs root"
    local t0=$SECONDS pid p
    step "stopping the cluster ($RUN)"
    # The controllers first, so that no deleted pod is replaced (CoreDNS's Deployment).
    for name in kube-controller-manager kube-scheduler; do
        pid=$(daemon_pid "$name") && [[ -n $pid ]] && { stop_pids "$pid" && ok "stopped $name ($pid)"; }
    done
    # Then the pods, through the kubelet while it runs: it stops their containers and
    # has CNI release their addresses.
    if [[ -n "$(daemon_pid kubelet)" ]] && kctl get --raw /readyz > /dev/null 2>&1; then
        kctl delete pods --all --all-namespaces --grace-period=1 --wait=false > /dev/null 2>&1 || true
        for _ in $(seq 60); do
            [[ -z "$(node_ctr tasks ls -q 2> /dev/null)" ]] && break
            sleep 0.5
        done
    fi
    for name in kube-proxy kubelet kube-apiserver etcd; do
        pid=$(daemon_pid "$name") && [[ -n $pid ]] && { stop_pids "$pid" && ok "stopped $name ($pid)"; }
    done
    # What the kubelet did not stop: containerd kills and deletes each task (its shim
    # exits with it), and the sandboxes' network namespaces are under $RUN.
    if [[ -n "$(daemon_pid containerd)" ]]; then
        for id in $(node_ctr tasks ls -q 2> /dev/null); do
            node_ctr tasks kill -s SIGKILL "$id" > /dev/null 2>&1 || true
            node_ctr tasks delete -f "$id" > /dev/null 2>&1 || true
        done
        pid=$(daemon_pid containerd) && stop_pids "$pid" && ok "stopped containerd ($pid)"
    fi
    # Mounts under $RUN: containers' root file systems, pod volumes, network namespaces.
    if [[ -d $RUN ]]; then
        local m
        for m in $(findmnt -rno TARGET | grep "^$RUN/" | sort -r); do
            umount "$m" 2> /dev/null || umount -l "$m"
        done
    fi
    cgroups_down
    net_down
    # The machine-wide sysctls the kubelet changed, and mount propagation.
    if [[ -f $RUN/sysctls ]]; then
        while IFS='=' read -r key value; do sysctl -qw "$key=$value"; done < "$RUN/sysctls"
    fi
    [[ -f $RUN/propagation && "$(cat "$RUN/propagation")" == private ]] && mount --make-rprivate /
    for p in "${OUTSIDE[@]}"; do
        if [[ ! -e $p ]] || grep -qx "$p" "$RUN/preexisting" 2> /dev/null; then continue; fi
        if [[ $p == /run/netns ]]; then
            # ip netns bind-mounts it on itself; another user's namespaces keep it busy.
            [[ -z "$(ls -A "$p")" ]] && umount "$p" 2> /dev/null
            rmdir "$p" 2> /dev/null || true
        else
            rm -rf "$p"
        fi
    done
    rm -rf "$RUN"
    ok "down in $((SECONDS - t0)) s: no daemons, mounts, namespace $NS, routes or cgroups left"
}

# The kubelet's cgroup root, in every v1 hierarchy and in v2: the kubelet requires it
# to exist. A new v1 cpuset has no CPUs or memory nodes: it gets its parent's.
cgroups_up() {
    local dir
    for dir in /sys/fs/cgroup/*/ /sys/fs/cgroup/unified/; do
        [[ $(stat -fc %T "$dir") == cgroup* ]] || continue
        mkdir -p "$dir${CGROUP_ROOT#/}"
    done
    cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset$CGROUP_ROOT/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset$CGROUP_ROOT/cpuset.mems"
}

# Removes the kubelet's cgroup tree from every hierarchy (v1 controllers and v2).
cgroups_down() {
    local dir
    for dir in /sys/fs/cgroup/*"$CGROUP_ROOT" /sys/fs/cgroup/unified"$CGROUP_ROOT"; do
        [[ -d $dir ]] && cgroup_remove "$dir"
    done
    return 0
}

# --- status and smoke -----------------------------------------------------------------

status() {
    local name pid
    [[ -f $PID_FILE ]] || { echo "no cluster ($RUN does not exist)"; return 1; }
    for name in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
        pid=$(daemon_pid "$name")
        if [[ -n $pid ]]; then ok "$name (pid $pid)"; else echo "    --  $name not running (log: $RUN/logs/$name.log)"; fi
    done
    kctl get nodes -o wide 2>&1 | indent
}

smoke() {
    local t0=$SECONDS ip answer
    step "smoke: a busybox web pod behind a ClusterIP Service, resolved and called from another pod"
    kctl apply -f - > /dev/null << EOF || fail "kubectl apply of the smoke pods failed"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default, labels: {app: web}}
spec:
  containers:
  - name: web
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'mkdir -p /www && echo "hello from \$(hostname)" > /www/index.html && exec httpd -f -p 8080 -h /www']
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sleep, "3600"]
EOF
    kctl wait --for=condition=Ready pod/web pod/client --timeout=90s > /dev/null ||
        { kctl describe pods | tail -n 30 | indent; fail "the smoke pods did not become Ready"; }
    ip=$(kctl get service web -o jsonpath='{.spec.clusterIP}')
    # The Service by name (CoreDNS; glibc's getent, as a program would resolve it) and by
    # the variables the kubelet gives every pod. nc: the wget of Debian's busybox-static
    # crashes (SIGSEGV, on the host too).
    local resolved
    resolved=$(kctl exec client -- getent hosts web.default.svc.cluster.local | awk '{print $1}') ||
        fail "client could not resolve web.default.svc.cluster.local"
    [[ $resolved == "$ip" ]] || fail "web.default.svc.cluster.local resolved to '$resolved', not the ClusterIP $ip"
    ok "client resolves web.default.svc.cluster.local -> $resolved (CoreDNS)"
    # shellcheck disable=SC2016 # expanded by the pod's shell
    answer=$(kctl exec client -- sh -c \
        'printf "GET / HTTP/1.0\r\n\r\n" | nc -w 5 "$WEB_SERVICE_HOST" "$WEB_SERVICE_PORT"' | tail -n1) ||
        fail "client could not reach the web Service at $ip:80"
    [[ $answer == "hello from web" ]] || fail "unexpected answer from the web Service: $answer"
    ok "client -> Service web ($ip:80) -> pod web ($(kctl get pod web -o jsonpath='{.status.podIP}')): \"$answer\""
    # A name outside the cluster must not resolve (and no query leaves).
    if kctl exec client -- getent hosts example.com > /dev/null 2>&1; then
        fail "example.com resolved inside the cluster: something answered from outside"
    fi
    ok "example.com does not resolve (CoreDNS has no upstream)"
    # An address outside the machine is unreachable (TEST-NET-3, never routed anyway).
    if answer=$(kctl exec client -- sh -c 'nc -w 3 203.0.113.1 80 < /dev/null 2>&1' 2> /dev/null); then
        fail "a pod connected to 203.0.113.1: traffic can leave the node"
    fi
    ok "203.0.113.1 from a pod: ${answer##*: }"
    cgroup_report
    kctl delete pod client web --grace-period=1 > /dev/null
    kctl delete service web > /dev/null
    ok "smoke passed in $((SECONDS - t0)) s"
}

# Where a container's processes sit: its /proc/PID/cgroup, the v2 line and the v1 lines.
cgroup_report() {
    local id pid uid
    uid=$(kctl get pod web -o jsonpath='{.metadata.uid}')
    id=$(kctl get pod web -o jsonpath='{.status.containerStatuses[0].containerID}')
    id=${id#containerd://}
    pid=$(node_ctr tasks ls | awk -v id="$id" '$1 == id {print $2}')
    [[ -n $pid ]] || fail "no task for container $id"
    ok "pod web (uid $uid), container ${id:0:12}, pid $pid; /proc/$pid/cgroup:"
    sed 's/^/        /' "/proc/$pid/cgroup"
    local v2
    v2=$(sed -n 's/^0:://p' "/proc/$pid/cgroup")
    if [[ -d /sys/fs/cgroup/unified$v2 ]]; then
        ok "cgroup v2: /sys/fs/cgroup/unified$v2 (cgroup.procs: $(paste -sd' ' "/sys/fs/cgroup/unified$v2/cgroup.procs"))"
    else
        echo "    !!  the v2 path $v2 does not exist under /sys/fs/cgroup/unified"
    fi
}

case ${1:-} in
    up) up ;;
    down) down ;;
    status) status ;;
    smoke) smoke ;;
    kubectl) shift && kctl "$@" ;;
    import) shift && for tar in "$@"; do node_ctr images import "$tar" > /dev/null && ok "imported $tar"; done ;;
    env) echo "export KUBECONFIG=$RUN/pki/admin.kubeconfig PATH=$K8S_BIN:\$PATH" ;;
    -h | --help) usage ;;
    *) usage >&2 && exit 2 ;;
esac
