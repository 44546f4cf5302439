#!/usr/bin/env bash
# Themis Mesh on the real cluster (scripts/k8s/cluster.sh): the images built here, the
# mesh's operator steps, deploy/ applied as it is, and what a platform engineer expects
# of it, each step a check that passes or fails with its reason.
#
#   scripts/k8s/suite.sh [--keep]     (the cluster must be up; needs root)
#
# It builds what it needs (release), so it also runs on its own after cluster.sh up.
# Prints "N passed, M failed" and exits non-zero if any check failed. --keep leaves
# the mesh running on the cluster for a look (scripts/k8s/cluster.sh kubectl ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh
# shellcheck source=scripts/k8s/versions.sh
source scripts/k8s/versions.sh # ISTIO_TAG

keep=false
[[ ${1:-} == --keep ]] && keep=true
cluster=scripts/k8s/cluster.sh
kctl() { "$cluster" kubectl "$@"; }
themis=${CARGO_TARGET_DIR:-target}/release/themis
work=$(mktemp -d /tmp/themis-k8s-suite.XXXXXX)
passed=0 failed=0
check() { # NAME CMD...: runs CMD; counts and says the result (its status is CMD's)
    local name=$1
    shift
    if out=$("$@" 2>&1); then
        passed=$((passed + 1)) && ok "$name"
    else
        failed=$((failed + 1)) && echo "    FAIL $name: $(tail -n 8 <<< "$out")"
        return 1
    fi
}
# until_ok SECONDS CMD...: CMD until it succeeds, at most SECONDS (each try bounded).
until_ok() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        ((SECONDS < deadline)) || return 1
        sleep 1
    done
}

created_state=false
cleanup() {
    $keep && { echo "    --keep: the mesh stays on the cluster; $work holds the mesh key"; return; }
    kctl delete namespace shop plain elsewhere --ignore-not-found --wait=true --timeout=90s > /dev/null 2>&1 || true
    kctl delete -f deploy/kubernetes/agent-daemonset.yaml --ignore-not-found --wait=true --timeout=60s > /dev/null 2>&1 || true
    # The node's state, socket and pinned capture outlive the agent's pod by design;
    # this suite made them, so it removes them.
    $created_state && rm -rf /var/lib/themis /var/run/themis /sys/fs/bpf/themis
    rm -rf "$work"
}
trap cleanup EXIT

# What the pods say, when a step that the rest needs failed: then stop.
stop_here() {
    local ns pod
    for ns in themis-system shop; do
        for pod in $(kctl -n "$ns" get pods -o name 2> /dev/null); do
            echo "    --- $ns/$pod: $(kctl -n "$ns" get "$pod" -o jsonpath='{range .status.initContainerStatuses[*]}{.name}={.state}{" "}{end}{range .status.containerStatuses[*]}{.name}={.state}{" "}{end}')"
            kctl -n "$ns" logs "$pod" --all-containers --tail=8 2>&1 | sed 's/^/        /'
        done
    done
    echo
    echo "$passed passed, $failed failed (stopped: the rest needs this step)"
    exit 1
}

"$cluster" status > /dev/null 2>&1 || fail "the cluster is not up: scripts/k8s/cluster.sh up"

step "release builds: the agent (with the eBPF capture), the node controller, the native and Wasm filters"
export THEMIS_EBPF=required
# As scripts/demo.sh builds them, invocation for invocation: Cargo unifies features
# per invocation, so another grouping would build every crate again.
cargo build -q --release -p themis-agent -p themis-cli -p themis-node-controller --bins
cargo build -q --release -p themis-native
cargo build -q --release -p themis-envoy --target wasm32-wasip1

step "images (scripts/k8s/images.sh): agent + controller, sidecar, demo app, istiod and Istio's proxy; imported, nothing pulled"
istio_bin=$(scripts/k8s/build-istio.sh --print-bin) || fail "Istio is not built: scripts/k8s/build-istio.sh"
scripts/k8s/images.sh "$work/images"
scripts/k8s/images.sh "$work/images" istio
"$cluster" import "$work/images"/{agent,sidecar,demo-app,istio-pilot,istio-proxyv2}.tar

step "the operator, offline: mesh 'k8s', the node's admission into its /var/lib/themis, its pod range, grants and bindings of handler, check and keyed"
"$themis" mesh create k8s --out "$work/mesh" > /dev/null
[[ -e /var/lib/themis ]] && fail "/var/lib/themis exists: this suite admits the node there and will not replace a node's state"
created_state=true
mkdir -p /var/lib/themis
node_id=$("$themis" --json node admit --mesh-dir "$work/mesh" --out /var/lib/themis | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
# Pods listen at their own IPs: the root grants the node its pod range, so that (with
# one-hop routing, the default) their endpoints belong to the node that endorses them.
node_pod_cidr() { kctl get nodes -o jsonpath='{.items[0].spec.podCIDR}'; }
has_pod_cidr() { [[ -n "$(node_pod_cidr)" ]]; }
until_ok 60 has_pod_cidr || fail "the node was allocated no pod range (.spec.podCIDR)"
pod_cidr=$(node_pod_cidr)
"$themis" node range "$pod_cidr" --mesh-dir "$work/mesh" --node /var/lib/themis > /dev/null
for service in handler check keyed; do
    "$themis" service grant "$service" --mesh-dir "$work/mesh" --node /var/lib/themis > /dev/null
done
ok "node ${node_id:0:16}…, pods at $pod_cidr, granted handler, check, keyed"
# Which pods may serve them (the agent requires a binding, the DaemonSet's config):
# handler and check any pod of namespace shop; keyed only shop's ServiceAccount web.
"$themis" service bind handler --namespace shop --mesh-dir "$work/mesh" > /dev/null
"$themis" service bind check --namespace shop --mesh-dir "$work/mesh" > /dev/null
"$themis" service bind keyed --namespace shop --service-account web --mesh-dir "$work/mesh" > /dev/null
cp "$work/mesh/trust-log.bin" /var/lib/themis/
ok "bound handler and check to namespace shop, keyed to shop's ServiceAccount web; the log is the node's"

step "deploy/kubernetes/agent-daemonset.yaml, applied as it is"
kctl apply -f deploy/kubernetes/agent-daemonset.yaml > /dev/null
check "the DaemonSet's pod is ready (agent + controller)" \
    kctl -n themis-system rollout status daemonset/themis-agent --timeout=120s || stop_here
agent_pod() { kctl -n themis-system get pods -l app=themis-agent -o jsonpath='{.items[0].metadata.name}'; }
on_agent() { kctl -n themis-system exec "$(agent_pod)" -c agent -- themis --socket /var/run/themis/agent.sock "$@"; }
on_controller() { kctl -n themis-system exec "$(agent_pod)" -c controller -- themis --socket /var/run/themis/agent.sock "$@"; }
routes_one_hop_with_its_range() { # read whole first (see the negative checks below)
    local ring logs
    ring=$(on_agent ring) && logs=$(kctl -n themis-system logs "$(agent_pod)" -c agent)
    grep -q "routing *one hop" <<< "$ring" && grep -q "granted this node an address range" <<< "$logs"
}
check "the agent routes one hop (the default) and holds the root's grant of the node's pod range" \
    until_ok 30 routes_one_hop_with_its_range || true
controller_least() { # the controller (a process run in its container, as the kubelet runs it): uid 65532, no capability; lists workloads, reads no capture state (the operator's)
    local status out
    status=$(kctl -n themis-system exec "$(agent_pod)" -c controller -- cat /proc/self/status) ||
        { echo "the controller's status could not be read"; return 1; }
    grep -q "^Uid:[[:space:]]*65532[[:space:]]" <<< "$status" || { echo "not uid 65532: $(grep ^Uid <<< "$status")"; return 1; }
    grep -q "^CapEff:[[:space:]]*0000000000000000$" <<< "$status" || { echo "capabilities: $(grep ^CapEff <<< "$status")"; return 1; }
    on_controller workloads > /dev/null || { echo "control: the controller cannot list workloads"; return 1; }
    on_agent capture > /dev/null || { echo "control: the operator cannot read the capture's state"; return 1; }
    if out=$(on_controller capture 2>&1); then
        echo "the controller read the capture's state: $out"
        return 1
    fi
    grep -qi "operator" <<< "$out" || { echo "refused, but not as a non-operator: $out"; return 1; }
}
check "the node controller runs as uid 65532 with no capability, and is not the agent's operator" controller_least || true

step "deploy/kubernetes/demo.yaml: handler and check with their sidecars, in namespace shop (themis.io/mesh=enabled)"
kctl apply -f deploy/kubernetes/demo.yaml > /dev/null
check "both Deployments become available" \
    kctl -n shop wait deployment/handler deployment/check --for=condition=Available --timeout=180s || stop_here
registrations() { # SERVICE: "workload pod-uid id" of each of the agent's registrations of SERVICE
    on_agent --json workloads | python3 -c "import json,sys; [print(r['workload'], r['metadata'].get('k8s-pod-uid'), r['id']) for r in json.load(sys.stdin)['registrations'] if r['service'] == '$1']"
}
registered() { [[ -n "$(registrations "$1")" ]]; } # SERVICE
both_registered() { registered check && registered handler; }
check "the controller registered both pods (no script)" until_ok 60 both_registered || stop_here

call() { # FROM URL: the app container of deployment FROM fetches URL
    kctl -n shop exec "deploy/$1" -c app -- python3 -c \
        "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('$2', timeout=5).read().decode())"
}
meshed_call() { # FROM TO: FROM calls TO by its Service name; TO's sidecar proved FROM's service
    local answer
    answer=$(call "$1" "http://$2/?n=7") || return 1
    python3 -c 'import json,sys; a=json.loads(sys.argv[1]); sys.exit(a.get("app") != sys.argv[3] or a.get("peer_service") != sys.argv[2])' \
        "$answer" "$1" "$2" || { echo "not $2 answering $1 as proven: $answer"; return 1; }
}
check "check calls handler by its Service name, which calls check: each side proves the other's service" \
    until_ok 30 meshed_call check handler || true
check "handler calls check" until_ok 10 meshed_call handler check || true
proxy_stat() { # DEPLOYMENT PREFIX SUFFIX: the sum of its sidecar's Envoy counters named PREFIX…SUFFIX
    kctl -n shop exec "deploy/$1" -c themis-proxy -- python3 -c \
        "import urllib.request,sys; s=urllib.request.urlopen('http://127.0.0.1:15000/stats').read().decode(); print(sum(int(v) for k, v in (l.rsplit(': ', 1) for l in s.splitlines() if ': ' in l) if k.startswith(sys.argv[1]) and k.endswith(sys.argv[2]) and v.isdigit()))" "$2" "$3"
}
over_tls() { # check's record takes tls,themis (the annotation, signed); handler's calls came over TLS 1.3, none over the channel
    local labels tls channel
    labels=$(on_agent --json workloads | python3 -c "import json,sys; [print(r['metadata'].get('themis.transport')) for r in json.load(sys.stdin)['registrations'] if r['service'] == 'check']") ||
        { echo "the agent's registrations could not be read"; return 1; }
    [[ $labels == tls,themis ]] || { echo "check's record names transports '$labels', not tls,themis"; return 1; }
    # Only handler has called check so far (the meshed calls above).
    tls=$(proxy_stat check listener. ssl.versions.TLSv1.3) &&
        channel=$(proxy_stat check themis.inbound. established) || { echo "check's sidecar's stats could not be read"; return 1; }
    ((tls >= 1)) || { echo "check's inbound listener took no TLS 1.3 handshake"; return 1; }
    ((channel == 0)) || { echo "check's sidecar established $channel channel sessions: handler spoke the channel"; return 1; }
}
check "check's record takes tls,themis (its annotation); handler's calls reach it over TLS 1.3, not the channel" over_tls || true
explained() { # the TRUSTED instance of check is the id of the pod's workload
    on_agent explain check | grep -q "TRUSTED *workload $(registrations check | cut -d' ' -f3)"
}
check "themis explain check (in the agent pod): check's pod's workload is trusted" explained || true

step "what the mesh leaves alone, and what it refuses"
kctl apply -f scripts/k8s/suite-pods.yaml > /dev/null
kctl -n plain wait pod/outsider pod/intruder --for=condition=Ready --timeout=60s > /dev/null
# probe HOST PORT connect|send: one TCP attempt from the pod it runs in; prints what
# happened as one word (and detail): dns-failed, connect-timed-out, connect-refused,
# connect-failed, connected (connect), or after an HTTP request (send): answered,
# closed-unanswered, no-answer-open. It exits 0 whatever happened, so a failed exec
# (kubectl, DNS of the API server, a missing pod) is told apart from the outcome.
probe_py=$(
    cat << 'EOF'
import socket, sys
host, port, send = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "send"
try:
    addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
except OSError as e:
    sys.exit(print("dns-failed", e))
try:
    s = socket.create_connection(addr, timeout=3)
except socket.timeout:
    sys.exit(print("connect-timed-out"))
except ConnectionRefusedError:
    sys.exit(print("connect-refused"))
except OSError as e:
    sys.exit(print("connect-failed", e))
if not send:
    sys.exit(print("connected"))
s.sendall(b"GET /?n=7 HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n\r\n")
try:
    data = s.recv(100)
except socket.timeout:
    sys.exit(print("no-answer-open"))
except ConnectionResetError:
    data = b""
print("answered " + repr(data[:60]) if data else "closed-unanswered")
EOF
)
from_outsider() { kctl -n plain exec outsider -- python3 -c "$probe_py" "$@"; }
check_pod=$(kctl -n shop get pods -l app=check -o jsonpath='{.items[0].metadata.name}')
check_ip=$(kctl -n shop get pods -l app=check -o jsonpath='{.items[0].status.podIP}')
# Negative checks read the answer whole first: under pipefail, `! cmd | grep -q x` also
# passes when grep found x and cmd died of SIGPIPE writing the rest. Each has a
# positive control on the same path (pod, name or address, exec), and passes only on
# the failure it claims, not on any failure.
unregistered_outsider() { # by pod uid; the control: check's pod is in the same answer
    local uids outsider_uid check_uid
    uids=$(on_agent --json workloads | python3 -c "import json,sys; [print(r['metadata'].get('k8s-pod-uid')) for r in json.load(sys.stdin)['registrations']]") ||
        { echo "the agent's registrations could not be read"; return 1; }
    outsider_uid=$(kctl -n plain get pod outsider -o jsonpath='{.metadata.uid}')
    check_uid=$(kctl -n shop get pod "$check_pod" -o jsonpath='{.metadata.uid}')
    [[ -n $outsider_uid && -n $check_uid ]] || { echo "no pod uids (outsider '$outsider_uid', check '$check_uid')"; return 1; }
    grep -qxF "$check_uid" <<< "$uids" || { echo "control: check's pod is not among the registrations read: $uids"; return 1; }
    if grep -qxF "$outsider_uid" <<< "$uids"; then
        echo "the outsider ($outsider_uid) is registered"
        return 1
    fi
}
check "a pod of an unlabelled namespace runs, unregistered" unregistered_outsider || true
host_path_pod() { # PATH [READONLY]: server-side dry run of a pod of namespace plain mounting host PATH
    kctl apply --dry-run=server -f - << POD 2>&1
apiVersion: v1
kind: Pod
metadata: {name: host-path-probe, namespace: plain}
spec:
  containers:
  - {name: app, image: localhost/themis/demo-app:dev, imagePullPolicy: Never, command: [sleep, "1"],
     volumeMounts: [{name: host, mountPath: /host, readOnly: ${2:-false}}]}
  volumes: [{name: host, hostPath: {path: "$1"}}]
POD
}
host_paths_pinned() { # the cluster-wide rule refuses Themis's directories outside themis-system; the controls pass
    local path out
    for path in /var/lib/themis /var/lib/themis/workloads /var/lib /var/ / /sys/fs/bpf/themis /sys /var/lib/./themis /var//lib/themis /run /var/run; do
        if out=$(host_path_pod "$path" true); then
            echo "a pod mounting $path was admitted: $out"
            return 1
        fi
        grep -q "themis-host-paths" <<< "$out" || { echo "$path refused, but not by the rule: $out"; return 1; }
    done
    for path in /var/run/themis /run/themis; do
        if out=$(host_path_pod "$path" false); then
            echo "a pod mounting $path writable was admitted: $out"
            return 1
        fi
        grep -q "themis-host-paths" <<< "$out" || { echo "$path writable refused, but not by the rule: $out"; return 1; }
    done
    out=$(host_path_pod /var/run/themis true) || { echo "control: the socket's directory read-only was refused: $out"; return 1; }
    out=$(host_path_pod /tmp false) || { echo "control: a hostPath elsewhere (/tmp) was refused: $out"; return 1; }
}
check "a pod of an unmeshed namespace may not mount /var/lib/themis, /sys/fs/bpf/themis or a directory around them, nor the agent's socket directory writable (ValidatingAdmissionPolicy themis-host-paths); read-only it may" \
    host_paths_pinned || true
inbound_refused_malformed() { # check's sidecar's count of connections refused as not Themis
    kctl -n shop exec "$check_pod" -c themis-proxy -- python3 -c \
        "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:15000/stats?filter=themis\\.inbound\\.refused\\.malformed').read().decode())" |
        python3 -c 'import sys; print(sum(int(l.rsplit(":", 1)[1]) for l in sys.stdin if ":" in l))'
}
refused_above() { local n; n=$(inbound_refused_malformed) && ((n > $1)); } # N
refused_plain() { # an unmeshed pod's plaintext HTTP to check's Service: closed by check's sidecar
    local reach before answer
    reach=$(from_outsider check.shop 80 connect) || { echo "exec in the outsider failed: $reach"; return 1; }
    [[ $reach == connected ]] || { echo "control: the outsider does not reach check.shop:80 at all: $reach"; return 1; }
    before=$(inbound_refused_malformed) || { echo "check's sidecar's stats could not be read"; return 1; }
    answer=$(from_outsider check.shop 80 send) || { echo "exec in the outsider failed: $answer"; return 1; }
    [[ $answer == closed-unanswered ]] || { echo "not closed unanswered: $answer"; return 1; }
    until_ok 10 refused_above "$before" || { echo "check's sidecar did not count refused.malformed (it was $before)"; return 1; }
}
check "an unmeshed pod's plaintext call to check's Service is refused by check's sidecar" refused_plain || true
# check's app listens on 127.0.0.1:8080 only, where the kernel would refuse another pod
# whatever the capture did: a listener on the pod's own address (port 8080 unless
# others are given), in the app container (its cgroup, which the capture guards), is
# what the capture must protect.
listener_py=$(
    cat << 'EOF'
import select, socket, sys, time
socks = []
for port in sys.argv[2:] or ["8080"]:
    s = socket.socket()
    s.bind((sys.argv[1], int(port)))
    s.listen(16)
    socks.append(s)
print("listening", flush=True)
end = time.time() + 90
while time.time() < end:
    for s in select.select(socks, [], [], 1)[0]:
        c, _ = s.accept()
        c.recv(100)
        c.sendall(b"app")
        c.close()
EOF
)
inbound_dropped() { on_agent --json capture | python3 -c 'import json,sys; print(json.load(sys.stdin)["counters"]["inbound_dropped"])'; }
# with_listener NAMESPACE POD CONTAINER CHECK IP [PORT...]: runs CHECK while listener_py
# listens at IP:PORT... (8080 without) in the container.
with_listener() {
    local ns=$1 pod=$2 container=$3 body=$4 listener status=0
    shift 4
    kctl -n "$ns" exec "$pod" -c "$container" -- python3 -c "$listener_py" "$@" > "$work/listener.txt" 2>&1 &
    listener=$!
    # (It says so once it listens.)
    if until_ok 20 grep -q '^listening' "$work/listener.txt"; then
        "$body" || status=1
    else
        echo "no listener at $* in $ns/$pod: $(cat "$work/listener.txt")"
        status=1
    fi
    kill "$listener" 2> /dev/null || true
    wait "$listener" 2> /dev/null || true
    return "$status"
}
dropped_from_outsider() { # IP PORT: the outsider's connect times out (its SYN dropped), and the capture counts it
    local before answer after
    before=$(inbound_dropped) || { echo "the agent's capture counters could not be read"; return 1; }
    answer=$(from_outsider "$1" "$2" send) && [[ $answer == connect-timed-out ]] ||
        { echo "$1:$2 not dropped (a dropped SYN times out): $answer"; return 1; }
    after=$(inbound_dropped) && ((after > before)) ||
        { echo "the capture did not count the drop (inbound_dropped $before, then ${after:-?})"; return 1; }
}
app_port_closed() { # the app port on the pod's address, from another pod: the capture drops the SYN
    local reach
    # The control: the outsider reaches the same address, on the mesh port.
    reach=$(from_outsider "$check_ip" 15006 connect) && [[ $reach == connected ]] ||
        { echo "control: the outsider does not reach $check_ip:15006: $reach"; return 1; }
    dropped_from_outsider "$check_ip" 8080
}
check "check's app port ($check_ip:8080) takes nothing from another pod (the capture)" \
    with_listener shop "$check_pod" app app_port_closed "$check_ip" || true
not_operator() { # root in another pod, through the agent's socket: refused as not the operator
    local out
    if out=$(kctl -n plain exec intruder -- themis --socket /var/run/themis/agent.sock \
        register check --workload evil --endpoint 10.244.0.99:15006 2>&1); then
        echo "registered: $out"
        return 1
    fi
    grep -qi "operator\|forbidden" <<< "$out" || { echo "refused, but not as a non-operator: $out"; return 1; }
    ! grep -q '"evil' <<< "$(on_agent --json workloads)"
}
check "root in another pod, with the agent's socket mounted, is not the operator: its registration is refused" not_operator || true
event_says() { # POD REASON [NAMESPACE]: an Event on POD (namespace shop unless NAMESPACE) with REASON
    kctl -n "${3:-shop}" get events --field-selector "involvedObject.name=$1,reason=$2" -o name | grep -q .
}
check "a pod of a service this node has no grant for is not meshed, and its Event says NotGranted" \
    until_ok 60 event_says rogue NotGranted || true
kctl -n shop delete pod rogue --wait=false > /dev/null
# A pod author claims a service this node is granted: check, from another meshed
# namespace; keyed, from shop but as another ServiceAccount than the one bound.
unbound_claims() { # both refused NotBound, neither registered; the controls: check and handler are
    until_ok 60 event_says impostor NotBound "$1" ||
        { echo "no NotBound Event on $1/impostor"; return 1; }
    local workloads
    workloads=$(on_agent --json workloads | python3 -c "import json,sys; [print(r['workload'], r['service']) for r in json.load(sys.stdin)['registrations']]") ||
        { echo "the agent's registrations could not be read"; return 1; }
    grep -q " check$" <<< "$workloads" && grep -q " handler$" <<< "$workloads" ||
        { echo "control: check and handler are not among the registrations read: $workloads"; return 1; }
    if grep -q "^impostor\.$1 " <<< "$workloads"; then
        echo "impostor.$1 is registered: $workloads"
        return 1
    fi
}
check "a pod of another meshed namespace annotated as service check is refused NotBound, not registered" \
    unbound_claims elsewhere || true
check "a pod of shop annotated as service keyed, not as keyed's ServiceAccount web, is refused NotBound" \
    unbound_claims shop || true
delegated_service() { # NAMESPACE POD: the service of the credential the agent gives POD's sidecar ("none": no endorsement)
    kctl -n "$1" exec "$2" -c themis-proxy -- sh -c \
        "rm -f /tmp/credential.json && themis --socket /var/run/themis/agent.sock delegate $2.$1 --out /tmp/credential.json --lifetime-secs 60 > /dev/null && cat /tmp/credential.json" |
        python3 -c 'import json,sys; c=json.load(sys.stdin); print(c.get("service") or ("endorsed" if c.get("endorsement") else "none"))'
}
no_endorsement_as_check() { # the impostor's sidecar gets a delegation with no service to prove; the control: check's gets check
    local theirs ours
    ours=$(delegated_service shop "$check_pod") || { echo "control: check's sidecar got no credential"; return 1; }
    [[ $ours == check ]] || { echo "control: check's sidecar's credential proves '$ours', not check"; return 1; }
    theirs=$(delegated_service elsewhere impostor) || { echo "the impostor's sidecar got no credential at all (expected one proving nothing)"; return 1; }
    [[ $theirs == none ]] || { echo "the impostor's sidecar can prove service $theirs"; return 1; }
}
check "the impostor's sidecar cannot call as check: its credential carries no endorsement (check's carries check's)" \
    no_endorsement_as_check || true
kctl delete namespace elsewhere --wait=false > /dev/null
kctl -n shop delete pod impostor --wait=false > /dev/null

# A bare pod made again under the same name (as a StatefulSet's next pod is): a new
# workload identity, the old one's key deleted from the node once its pod is gone.
keyed_pod() { # (re)creates pod web-0 of service keyed: a sidecar container that only sleeps
    kctl apply -f - > /dev/null << 'EOF'
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: shop, annotations: {themis.io/service: keyed, themis.io/exclude-inbound-ports: "9091"}}
spec:
  serviceAccountName: web
  terminationGracePeriodSeconds: 1
  containers:
  - {name: themis-proxy, image: localhost/themis/demo-app:dev, imagePullPolicy: Never, command: [sleep, "3600"]}
EOF
}
keyed_id() { registrations keyed | awk '$1 == "web-0.shop" {print $3}'; }
keyed_registered() { [[ -n "$(keyed_id)" ]]; }
keyed_key=/var/lib/themis/workloads/web-0.shop.key
key_gone() { [[ ! -e $keyed_key ]] && ! keyed_registered; }
new_identity_for_the_same_name() {
    local first second
    keyed_pod
    until_ok 60 keyed_registered || { echo "web-0 was not registered as keyed"; return 1; }
    first=$(keyed_id)
    [[ -e $keyed_key ]] || { echo "control: no key file $keyed_key for the registered web-0"; return 1; }
    kctl -n shop delete pod web-0 --wait=true --timeout=60s > /dev/null
    until_ok 60 key_gone || { echo "web-0 is gone, its key file or registration is not ($(keyed_id))"; return 1; }
    keyed_pod
    until_ok 60 keyed_registered || { echo "the new web-0 was not registered"; return 1; }
    second=$(keyed_id)
    [[ $second != "$first" ]] || { echo "the new web-0 got the old pod's identity ${first:0:16}…"; return 1; }
    echo "web-0: ${first:0:16}…, then ${second:0:16}…"
}
check "a pod made again under the same name gets a new identity; the old pod's key is deleted with it" \
    new_identity_for_the_same_name || true
# Every port is captured, declared or not (web-0 declares none); only the one its
# annotation exempts takes another pod's connection.
undeclared_closed_exempt_open() { # the control: web-0 is registered (captured)
    local reach
    keyed_registered || { echo "control: web-0 is not registered (nothing captured)"; return 1; }
    reach=$(from_outsider "$web0_ip" 9091 connect) && [[ $reach == connected ]] ||
        { echo "the exempted port 9091 does not take the outsider's connection: $reach"; return 1; }
    dropped_from_outsider "$web0_ip" 9090
}
web0_ip=$(kctl -n shop get pod web-0 -o jsonpath='{.status.podIP}')
check "a port no container declares takes no connection from another pod; the port web-0's annotation exempts does" \
    with_listener shop web-0 themis-proxy undeclared_closed_exempt_open "$web0_ip" 9090 9091 || true
kctl -n shop delete pod web-0 --wait=false > /dev/null 2>&1 || true

step "pods come and go: deletion withdraws, a rollout and an agent restart fail no call"
old=$(registrations check)
kctl -n shop delete pod -l app=check --wait=true > /dev/null
moved() { local now; now=$(registrations check); [[ -n $now && $now != "$old" && $(wc -l <<< "$now") == 1 ]]; }
check "deleting check's pod withdraws its registration; its replacement is registered" until_ok 90 moved || true
calls_during() { # SECONDS: handler calls check every 100 ms for SECONDS; prints "ok N failed M"
    kctl -n shop exec deploy/handler -c app -- python3 -c "
import time, urllib.request
ok = failed = 0
end = time.time() + $1
while time.time() < end:
    try:
        urllib.request.urlopen('http://check/?n=7', timeout=5).read(); ok += 1
    except Exception as e:
        body = e.read()[:160] if hasattr(e, 'read') else b''
        failed += 1; print(time.strftime('%T'), 'failed:', e, body)
    time.sleep(0.1)
print('ok', ok, 'failed', failed)"
}
no_failed_call() { # CMD...: runs CMD while handler calls check; no call may fail
    calls_during 40 > "$work/calls.txt" 2>&1 &
    local caller=$!
    sleep 3
    "$@" > /dev/null
    wait "$caller" || true
    grep -q "failed 0$" "$work/calls.txt" && grep -q "^ok [1-9]" "$work/calls.txt" && return
    # Where the failures came from: handler's sidecar (local) or check's (upstream),
    # the failed calls last, as check() shows the last lines.
    local stats
    for pod in deploy/handler deploy/check; do
        stats=$(kctl -n shop exec "$pod" -c themis-proxy -- python3 -c \
            "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:15000/stats?filter=(rq_5|rq_4|cx_connect_fail|no_healthy|reset|retry|refused)').read().decode())" 2>&1)
        echo "$pod: $(grep -v ': 0$' <<< "$stats" | tr '\n' ' ')"
    done
    grep "failed" "$work/calls.txt" | tail -n 4
    return 1
}
rollout() { kctl -n shop rollout restart deployment/check && kctl -n shop rollout status deployment/check --timeout=120s; }
check "rolling check's Deployment while handler calls it: no failed call" no_failed_call rollout || true
restart_agent() {
    kctl -n themis-system delete pod -l app=themis-agent --wait=true &&
        kctl -n themis-system rollout status daemonset/themis-agent --timeout=120s
}
check "killing the agent pod (the DaemonSet restarts it) while handler calls check: no failed call" \
    no_failed_call restart_agent || true
new_pod_meshed() { # the running check pod's uid is the one registered
    local uid
    uid=$(kctl -n shop get pods -l app=check --field-selector=status.phase=Running -o jsonpath='{.items[*].metadata.uid}')
    [[ -n $uid && $(registrations check | cut -d' ' -f2) == "$uid" ]]
}
kctl -n shop delete pod -l app=check --wait=false > /dev/null
check "after the restart, the restarted controller meshes check's next pod" until_ok 90 new_pod_meshed || true

step "Istio from source: istiod, pilot-agent and istioctl built here (scripts/k8s/build-istio.sh), installed as a user does (istioctl install -f deploy/istio/install/istio.yaml)"
istio_installed() {
    eval "$("$cluster" env)" # KUBECONFIG, in this check's subshell
    "$istio_bin/istioctl" install -y \
        -f deploy/istio/install/istio.yaml --set tag="$ISTIO_TAG" --readiness-timeout 180s > "$work/istioctl.log" 2>&1 ||
        { tail -n 5 "$work/istioctl.log"; return 1; }
    kctl -n istio-system get pods -l app=istiod -o jsonpath='{.items[0].spec.containers[0].image}' | grep -qx "localhost/istio/pilot:$ISTIO_TAG"
}
check "istioctl install: istiod ($ISTIO_TAG, the image built here) ready, its webhooks registered" istio_installed || stop_here
istio_valid() { kctl apply --dry-run=server -f deploy/istio/; } # the patches; install/ is istioctl's and the demo
check "EnvoyFilter, PeerAuthentication and WasmPlugin of deploy/istio/ pass the API server's and istiod's validation" istio_valid || true

kctl apply -f deploy/istio/install/demo.yaml > /dev/null
check "deploy/istio/install/demo.yaml (namespace mall, istio-injection=enabled): check v1 and v2 and handler become available" \
    kctl -n mall rollout status deployment/check-v1 deployment/check-v2 deployment/handler --timeout=120s || stop_here
injected() { # every pod of mall has Istio's istio-init and istio-proxy, which the manifest does not write
    local pods
    pods=$(kctl -n mall get pods -o jsonpath='{range .items[*]}{.metadata.name}:{.spec.initContainers[*].name} {.spec.containers[*].name}{"\n"}{end}')
    [[ $(grep -c . <<< "$pods") -eq 3 ]] || { echo "not 3 pods: $pods"; return 1; }
    ! grep -v "istio-init.*istio-proxy" <<< "$pods" || { echo "not injected (above)"; return 1; }
    ! grep -q "istio-proxy\|istio-init" deploy/istio/install/demo.yaml || { echo "deploy/istio/install/demo.yaml writes a sidecar itself"; return 1; }
}
check "Istio's own webhook injected istio-init and istio-proxy (pilot-agent + the stock Envoy) into each pod" injected || true
in_mall() { # DEPLOYMENT PYTHON: runs PYTHON in the app container of one of DEPLOYMENT's pods
    kctl -n mall exec "deploy/$1" -c app -- python3 -c "$2"
}
istio_mtls() { # handler's call reaches check over Istio's mTLS: check's sidecar names handler's principal
    local answer
    answer=$(in_mall handler "import urllib.request; print(urllib.request.urlopen('http://check/', timeout=5).read().decode())") || return 1
    grep -q 'URI=spiffe://cluster.local/ns/mall/sa/handler"' <<< "$answer" ||
        { echo "check saw no client certificate of handler's: $answer"; return 1; }
}
check "handler calls check by plain URL over Istio's mTLS: check's app sees handler's principal (spiffe://cluster.local/ns/mall/sa/handler)" \
    until_ok 30 istio_mtls || true
split() { # 1,000 calls from handler: the VirtualService's 80/20 within 5 points
    local counts
    counts=$(in_mall handler "
import collections, json, urllib.request
seen = collections.Counter()
for _ in range(1000):
    answer = json.loads(urllib.request.urlopen('http://check/', timeout=5).read())
    seen[answer['host'].rsplit('-', 2)[0]] += 1
print(seen['check-v1'], seen['check-v2'])") || return 1
    read -r v1 v2 <<< "$counts"
    echo "v1 $v1, v2 $v2 of 1000"
    ((v1 + v2 == 1000 && v2 >= 150 && v2 <= 250))
}
check "a VirtualService splits check 80/20 between its versions: over 1,000 calls within 5 points" split || true
by_principal() { # the AuthorizationPolicy admits handler's principal and refuses check's own
    local refused
    istio_mtls || return 1
    refused=$(in_mall check-v2 "
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen('http://check/', timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())") || return 1
    [[ $refused == "403 RBAC: access denied" ]] || { echo "check-v2 (principal sa/check) was not refused: $refused"; return 1; }
}
check "an AuthorizationPolicy by principal admits handler and refuses another principal (403, Envoy's RBAC)" by_principal || true

echo
echo "$passed passed, $failed failed"
((failed == 0))
