#!/usr/bin/env bash
# The main job: a Themis mesh of three nodes on this one machine.
#
#   node 1 (10.77.0.1)  handler   its app calls http://check/check?n=… by plain URL
#   node 2 (10.77.0.2)  client    curl -d <marker> http://handler/check?n=7
#   node 3 (10.77.0.3)  check     answers with what it got, the caller's verified id too
#
# The mesh operator creates the mesh and admits the three nodes, offline. Each node is
# a network namespace on a shared bridge and runs a host agent; the agents form the DHT
# ring. Each workload is a "pod": a cgroup with its app and its sidecar Envoy (the
# Themis filter). Service names resolve to virtual IPs that nothing answers (like
# Kubernetes ClusterIPs): the agents' eBPF capture sends the apps' connections to their
# sidecar, which resolves the service through the ring, authenticates the instance by
# its self-certifying id and seals the request. The app port takes connections only
# from the local sidecar. A capture on the wire between the nodes shows the sealing.
# Every statement the operator signs goes into the mesh's trust log, which the agents
# copy from each other and check; the demo revokes a workload through it. The agents
# route one hop (the default): each holds every admitted node at the address it signed (spread by
# gossip, with the log's growth), computes who holds a name and asks it directly; the
# demo times the revocation's way to every node.
#
# Usage (as root):
#   scripts/demo.sh [--runtime native|wasm] [--transport themis|tls] [--fast-path] [--full-ids] [--keep]
#       --runtime    who seals in the sidecars: native (default; the Envoy dynamic
#                    module libthemis_native.so, transport sockets) or wasm (the
#                    proxy-wasm filter's internal listener and outbound HTTP filter,
#                    the module pinned by its SHA-256) (docs/FILTER.md)
#       --transport  native: tls (default; Envoy's own TLS 1.3, the module its
#                    certificate validator; each record names tls, and check's Envoy
#                    also runs its own RBAC on the caller's URI SAN and logs it:
#                    docs/PROTOCOL.md §8) or themis (the paper's channel, which the
#                    Wasm runtime always speaks)
#       --fast-path  the agents' same-node fast path: sockets of an app and its sidecar
#                    pass data socket to socket (sk_msg) instead of through loopback TCP
#       --full-ids   print ids whole instead of a unique prefix
#       --keep       leave the mesh running and print commands to explore it
#   scripts/demo.sh --down                 tear a kept mesh down
#   with a kept mesh:
#   scripts/demo.sh pod WORKLOAD CMD...    run CMD in that pod (its cgroup, its node's network)
#   scripts/demo.sh node N CMD...          run CMD on node N (`themis` there talks to its agent)
#   scripts/demo.sh add-check              a second instance of check: workload check-2 on node 2
#   scripts/demo.sh calls [N]              N calls client -> handler -> check, counted by instance
#   scripts/demo.sh kill-node N            node N's agent and pods die at once (SIGKILL)
#
# The first run takes about 10 minutes on 2 cores: the set-up (scripts/setup.sh --quick,
# about 5) and a release build (about 5, cargo shows its progress); later runs about a
# minute. Everything it creates (namespaces, /etc/netns entries, cgroups, bpffs pins,
# files) is named themis-demo-<pid> and removed on exit, error or Ctrl-C, or by --down.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh
# shellcheck source=scripts/lib/netns.sh
source scripts/lib/netns.sh

STATE=/run/themis-demo.state # where a kept mesh is (sourced by the commands above)
ONE_LINE_FAST_PATH="the fast path (sockops + sk_msg) hands an app's bytes straight to its sidecar's socket, skipping loopback TCP: in benchmarks/RESULTS.md round trips are a third shorter (1 KiB: 6.7 -> 4.3 us) but streaming 1 KiB writes runs at 0.44x, and next to Envoy's ~0.25 ms per request neither shows; off by default"

section() { printf '\n'; step "$@"; }
json() { python3 -c "import json,sys; v=json.load(sys.stdin); print($1)"; }
report() { DEMO_IDS=$work/ids DEMO_FULL_IDS=$full_ids python3 "$repo/scripts/lib/demo-report.py" "$@"; }
short() { report short "$1"; }

# --- names: unique per run (two runs do not collide), short enough for links ---------
set_names() { # NAME
    name=$1
    fab=$name-fab
    PID_FILE=$work/pids
}
ns() { echo "$name-n$1"; }
ip_of() { echo "10.77.0.$1"; }
pod_of() { echo "$CGROUP_FS/$name/n$1/$2"; }
pin_dir() { echo "/sys/fs/bpf/$name-n$1"; }
declare -A vip=([check]=10.96.0.10 [handler]=10.96.0.11 [client]=10.96.0.12)
declare -A node_of=([handler]=1 [client]=2 [check]=3)
# A pod's ports, by its slot on the node (pods share their node's network namespace).
app_port() { echo $((8080 + $1)); }
outbound_of() { echo "127.0.0.1:$((15001 + 10 * $1))"; }
inbound_port() { echo $((15006 + 10 * $1)); }
admin_port() { echo $((15000 + 10 * $1)); }
# The filter module, served on each node's loopback to its sidecars, which fetch it
# and load it only if its SHA-256 is the one pinned in their configuration.
MODULE_PORT=15090
module_url() { echo "http://127.0.0.1:$MODULE_PORT/themis_envoy.wasm"; }
on() { local n=$1; shift; "$themis" --socket "$work/n$n/agent.sock" "$@"; }

binaries() {
    local target=${CARGO_TARGET_DIR:-target}
    [[ $target == /* ]] || target=$repo/$target
    themis=$target/release/themis
    wasm=$target/wasm32-wasip1/release/themis_envoy.wasm
    native_dir=$target/release   # libthemis_native.so
    envoy=$repo/.venv/bin/envoy
}

# --- teardown: the trap's and --down's ------------------------------------------------
keep_on_exit=0
work=""
teardown() {
    local n service workload
    if [[ -f $work/registrations ]]; then
        while read -r n service workload; do
            timeout 5 "$themis" --socket "$work/n$n/agent.sock" deregister "$service" --workload "$workload" > /dev/null 2>&1
        done < "$work/registrations"
    fi
    # The pods first, then the agents (which leave the ring gracefully on SIGTERM).
    # shellcheck disable=SC2046 # lists of pids
    stop_pids $(recorded_pids "* pod *")
    # shellcheck disable=SC2046
    stop_pids $(recorded_pids "*")
    cgroup_remove "$CGROUP_FS/$name"
    netns_down "$(ns 1)" "$(ns 2)" "$(ns 3)" "$fab"
    # Capture links are pinned to outlive their agent: unpinning is what detaches the
    # rest (an agent stopped before it could deregister).
    rm -rf /sys/fs/bpf/"$name"-*
    rm -rf "$work"
    if [[ -f $STATE ]] && grep -qx "name=$name" "$STATE"; then rm -f "$STATE"; fi
}

on_exit() {
    local status=$? log
    trap '' INT TERM
    set +e
    ((keep_on_exit)) && exit "$status"
    if ((status != 0 && status != 130 && status != 143)) && [[ -d $work ]]; then
        echo "--- the demo failed (exit $status); the end of each log:"
        for log in "$work"/*/*.log; do [[ -s $log ]] && { echo "--- $log"; tail -n 12 "$log"; }; done
    fi
    if [[ -n $work ]]; then
        echo "==> cleaning up"
        teardown
    fi
    exit "$status"
}

# --- set-up and build -----------------------------------------------------------------
set_up_machine() {
    section "set-up (scripts/setup.sh --quick: installs what is missing, says ok for the rest)"
    scripts/setup.sh --quick
    export PATH="$HOME/.cargo/bin:$PATH"
    export THEMIS_EBPF=required # the capture needs its eBPF programs built
    mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
}

build() {
    section "building the agent (with the eBPF capture) and the Envoy filter, release (about 5 minutes the first time)"
    # The same three builds as the Kubernetes suite's and the tests' (the node
    # controller with the agent: one set of features, so each is built once).
    cargo build --release -p themis-agent -p themis-cli -p themis-node-controller --bins
    cargo build --release -p themis-envoy --target wasm32-wasip1
    cargo build --release -p themis-native
}

# --- the operator ---------------------------------------------------------------------
# Offline, with the mesh key: a mesh, an admission per node (the node's key and its
# credential, in the state directory its agent starts with), and who may serve what.
operator() { # the mesh, the nodes, their grants
    local n service id
    section "the operator, offline: creates mesh 'demo', admits three nodes, grants each its service"
    id=$("$themis" --json mesh create demo --out "$work/mesh" | json 'v["id"]')
    echo "$id mesh demo" >> "$work/ids"
    for n in 1 2 3; do
        id=$("$themis" --json node admit --mesh-dir "$work/mesh" --out "$work/n$n" | json 'v["id"]')
        echo "$id node $n" >> "$work/ids"
    done
    for service in handler client check; do
        grant "$service" "${node_of[$service]}"
    done
    echo "    mesh id $(short "$(head -n1 "$work/ids" | cut -d' ' -f1)"): $work/mesh/mesh.key stays with the operator"
    for n in 1 2 3; do
        echo "    node $n: node id $(short "$(sed -n "$((n + 1))p" "$work/ids" | cut -d' ' -f1)"), granted $(ls "$work/n$n/grants" | sed 's/\.pem$//' | paste -sd,)"
    done
    echo "    (ids are shortened to a prefix unique among the demo's ids, as git shortens hashes; --full-ids prints them whole)"
}

grant() { # SERVICE NODE
    "$themis" service grant "$1" --mesh-dir "$work/mesh" --node "$work/n$2" > /dev/null
}

# --- the nodes and their agents ---------------------------------------------------------
nodes() {
    local hosts=() service n
    section "three nodes: network namespaces $(ns 1)..3 on a bridge (10.77.0.0/24)"
    fabric_up "$fab" "$(ns 1)=$(ip_of 1)/24" "$(ns 2)=$(ip_of 2)/24" "$(ns 3)=$(ip_of 3)/24"
    for service in check handler client; do hosts+=("${vip[$service]} $service"); done
    for n in 1 2 3; do hosts_file "$(ns "$n")" "${hosts[@]}"; done
    echo "    service IPs, in every node's /etc/hosts: $(printf '%s, ' "${hosts[@]}" | sed 's/, $//')"
    echo "    (nothing routes or answers there: connections to them work only through the capture)"
}

start_agent() { # N [JOIN]
    local n=$1
    spawn "n$n agent" "$(ns "$n")" - "$work/n$n/agent.log" \
        "$themis" agent --state-dir "$work/n$n" --listen "$(ip_of "$n"):7000" \
        --metrics 127.0.0.1:9464 --stabilise-ms 250 ${2:+--join "$2"} \
        --gossip-ms 1000 \
        --capture --bpf-pin-dir "$(pin_dir "$n")" "${fast_path[@]}" \
        --operator-cgroup "$CGROUP_FS/$name/operator"
    retry_while "$last_pid" 100 on "$n" status || fail "node $n's agent did not start"
}
joined() { on "$1" --json status | json 'v["joined"]' | grep -q True; }
holds_members() { [[ $(on "$1" --json ring | json 'v.get("members") or 0') == "$2" ]]; } # N COUNT

agents() {
    local bootstrap n
    section "a host agent per node, with the capture (mesh 'demo'${fast_path:+, fast path on})"
    start_agent 1
    bootstrap=$(on 1 --json status | json 'v["id"]+"@"+v["listen"]')
    echo "    node 1 started the ring"
    for n in 2 3; do
        start_agent "$n" "$bootstrap"
        retry 100 joined "$n" || fail "node $n did not join"
        echo "    node $n joined through node 1 (node id $(short "${bootstrap%@*}") at ${bootstrap#*@})"
    done
    for n in 1 2 3; do retry 100 holds_members "$n" 3 || fail "node $n does not hold the full membership"; done
    echo "    one-hop routing: each agent holds all 3 admitted nodes at the addresses they signed (gossip), and asks a name's holders directly"
}

# --- the filter module, pinned -----------------------------------------------------------
serve_module() { # N
    local n=$1
    spawn "n$n module server" "$(ns "$n")" - "$work/n$n/module-server.log" \
        python3 -m http.server "$MODULE_PORT" --bind 127.0.0.1 --directory "$work/module"
    retry_while "$last_pid" 50 on_node "$(ns "$n")" curl -sf -o /dev/null "$(module_url)" ||
        fail "node $n's module server did not start"
}

modules() {
    local n
    if [[ $runtime == native && $transport == tls ]]; then
        echo "    runtime native, transport tls: the sidecars speak Envoy's own TLS 1.3; the Envoy dynamic module"
        echo "    $native_dir/libthemis_native.so picks the instance and checks every certificate as Envoy's validator,"
        echo "    the agents serve each sidecar its certificate over SDS"
        return
    fi
    if [[ $runtime == native ]]; then
        echo "    runtime native: the sidecars run the Envoy dynamic module $native_dir/libthemis_native.so"
        echo "    (its HTTP filter picks, its transport sockets seal; no Wasm: --runtime wasm for the proxy-wasm filter)"
        return
    fi
    mkdir -p "$work/module"
    cp "$wasm" "$work/module/themis_envoy.wasm"
    for n in 1 2 3; do serve_module "$n"; done
    echo "    the filter module, pinned: every sidecar fetches $(module_url) on its node and"
    echo "    loads it only if its SHA-256 is $(sha256sum "$work/module/themis_envoy.wasm" | cut -c1-16)… (as rendered into its configuration)"
    echo "    runtime wasm: the sidecars seal in the Wasm filter's internal listener"
}

# What `themis sidecar render` needs for the runtime: the pinned Wasm module, or the services
# the app calls (a sealing cluster each).
runtime_args() {
    case $runtime in
        native) echo --transport "$transport" --calls handler --calls check ;;
        wasm) echo --wasm "$work/module/themis_envoy.wasm" --wasm-url "$(module_url)" ;;
    esac
}

# On TLS, the same rule as the policy in Envoy's own RBAC: the principal of each
# service the policy allows (its callers' URI SAN), as render's arguments.
rbac_args() { # POLICY
    [[ $transport == tls && -n $1 ]] || return 0
    python3 -c 'import json,sys; [print("--rbac-principal", "spiffe://demo/svc/" + r["service"]) for r in json.loads(sys.argv[1]).get("allow", []) if "service" in r]' "$1"
}

# --- the pods ----------------------------------------------------------------------------
# A pod: its cgroup; its workload's identity (created by the agent); its registration
# (the agent attaches the capture to the pod's cgroup, the proxy exempt, then signs and
# stores the record); then its sidecar Envoy in <pod>/proxy.
start_pod() { # SERVICE WORKLOAD NODE SLOT [POLICY]
    local service=$1 workload=$2 n=$3 slot=$4 policy=${5:-} pod id
    pod=$(pod_of "$n" "$workload")
    pod_cgroup "$pod"
    id=$(on "$n" --json workload "$workload" | json 'v["id"]')
    echo "$id workload $workload $service $n" >> "$work/ids"
    on "$n" register "$service" --workload "$workload" --endpoint "$(ip_of "$n"):$(inbound_port "$slot")" \
        --transport "$transport" --cgroup "$pod" --proxy-cgroup "$pod/proxy" --outbound "$(outbound_of "$slot")" \
        --inbound-port "$(app_port "$slot")" > "$work/n$n/register-$workload.txt" 2>&1 ||
        fail "registering $workload: $(cat "$work/n$n/register-$workload.txt")"
    echo "$n $service $workload" >> "$work/registrations"
    echo "$workload $service $n $slot" >> "$work/pods"
    # shellcheck disable=SC2046 # the runtime's arguments, as words
    "$themis" sidecar render --mesh-root "$work/mesh/mesh.root" --workload "$workload" --service "$service" \
        --agent-socket "$work/n$n/agent.sock" --app "127.0.0.1:$(app_port "$slot")" \
        --outbound "$(outbound_of "$slot")" --inbound "$(ip_of "$n"):$(inbound_port "$slot")" \
        --admin-port "$(admin_port "$slot")" --access-log "$work/n$n/$workload-outbound.access" \
        ${policy:+--policy "$policy"} --runtime "$runtime" $(runtime_args) $(rbac_args "$policy") \
        > "$work/n$n/$workload-envoy.yaml"
    spawn "n$n pod $workload envoy" "$(ns "$n")" "$pod/proxy" "$work/n$n/$workload-envoy.log" \
        env ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$native_dir" "$envoy" -c "$work/n$n/$workload-envoy.yaml" --concurrency 1 --disable-hot-restart \
        --base-id "$((base_id + n * 10 + slot))" -l warn
    retry_while "$last_pid" 300 on_node "$(ns "$n")" curl -sf "http://127.0.0.1:$(admin_port "$slot")/ready" ||
        fail "$workload's Envoy did not become ready"
    echo "    $workload (service $service) on node $n: workload id $(short "$id"), pod $pod, its sidecar ready"
}

# An app in its pod, on its app port on every address, as a pod's server would be.
start_app() { # WORKLOAD NODE SLOT ARGS...
    local workload=$1 n=$2 slot=$3
    shift 3
    spawn "n$n pod $workload app" "$(ns "$n")" "$(pod_of "$n" "$workload")/app" "$work/n$n/$workload-app.log" \
        python3 "$repo/scripts/demo-app.py" "$@" 0.0.0.0 "$(app_port "$slot")"
    retry_while "$last_pid" 50 grep -q listening "$work/n$n/$workload-app.log" || fail "$workload's app did not start"
}

# Registrations travel through the ring; waits until node N resolves SERVICE to COUNT.
resolves() { on "$1" --json resolve "$2" --fresh | json 'len(v["instances"])' | grep -qx "$3"; }

pods() {
    local pair
    section "pods: a cgroup each (app, proxy), registered with the capture, a sidecar Envoy"
    modules
    start_pod check check 3 0 '{"allow":[{"service":"handler"}]}'
    start_app check 3 0 --role check
    start_pod handler handler 1 0 '{"allow":[{"service":"client"}]}'
    start_app handler 1 0 --role handler --upstream http://check
    start_pod client client 2 0 '{"allow":[]}'
    echo "    policies: check admits callers verified as 'handler', handler admits 'client', client admits nobody"
    for pair in "2 handler" "1 check" "3 handler" "1 client"; do
        # shellcheck disable=SC2086 # node and service, as two words
        retry 50 resolves $pair 1 || fail "node ${pair% *} cannot resolve ${pair#* }"
    done
}

# --- the report ------------------------------------------------------------------------
report_ring() {
    local n
    section "the ring: three agents (node ids), every message between them over the Themis channel"
    for n in 1 2 3; do on "$n" --json status > "$work/n$n/status.json"; done
    report ring "$work"/n{1,2,3}/status.json | indent
}

report_services() {
    local service
    section "services and their instances (themis resolve, on node 1; workload ids: the keys the sidecars hold)"
    for service in check handler client; do
        on 1 --json resolve "$service" > "$work/resolve-$service.json"
        report resolve "$work/resolve-$service.json" | indent
    done
}

report_capture() {
    local n
    section "the capture: what each agent attached to its pod (themis capture)"
    for n in 1 2 3; do
        echo "    node $n:"
        on "$n" capture | grep -v counters: | sed 's/^/      /'
    done
}

# The call, with a marker in its body, while tcpdump records node 1's link to the
# bridge (v1 in the fabric namespace): the marker crosses it twice, client -> handler
# and handler -> check.
call_through_mesh() {
    local client_app marker path='/check?n=7' code
    section "a request through the mesh: node 2's client runs curl -d <marker> http://handler$path"
    marker="themis-demo-marker-$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    spawn "tcpdump" "$fab" - "$work/tcpdump.log" tcpdump -i v1 -n -s 0 --immediate-mode -U -w "$work/wire.pcap" tcp
    retry_while "$last_pid" 50 grep -q "listening on" "$work/tcpdump.log" || fail "tcpdump did not start"
    client_app=$(pod_of 2 client)/app
    code=$(in_pod "$(ns 2)" "$client_app" curl -s -m 20 -o "$work/answer.json" -w '%{http_code}' \
        -d "$marker" "http://handler$path") || true
    sleep 0.5 # the last segments
    # shellcheck disable=SC2046
    stop_pids $(recorded_pids tcpdump)
    [[ $code == 200 ]] || fail "the client got HTTP $code: $(cat "$work/answer.json" 2> /dev/null)"
    echo "    what the apps saw (plain HTTP, on their own node's loopback):"
    report answer "$work/answer.json" "$marker" | sed 's/^/      /' || fail "the apps saw other peers than the ring resolves"
    echo "    on the wire: tcpdump on node 1's link to the bridge during that call:"
    report wire "$work/wire.pcap" "$marker" "$path" | sed 's/^/      /' ||
        fail "the capture holds the marker or the path, or no sealed request (tcpdump: $(paste -sd' ' "$work/tcpdump.log"))"
}

# TLS: Envoy's own features see the peer: check's inbound access log names the caller
# by the URI SAN TLS proved, and its RBAC (the rule rendered from check's policy)
# admitted it.
envoy_sees_the_peer() {
    local log=$work/n3/check-envoy.log admin
    [[ $transport == tls ]] || return 0
    section "Envoy's own features see the peer (TLS): check's access log and RBAC"
    retry 25 grep -q "inbound POST /check?n=7 peer=spiffe://demo/svc/handler -> 200" "$log" ||
        fail "check's access log has no line naming handler's URI SAN"
    echo "    check's inbound access log (%DOWNSTREAM_PEER_URI_SAN%, the validator held it to the proof):"
    grep "inbound POST /check?n=7 peer=" "$log" | tail -n1 | sed 's/^/      /'
    admin=$(admin_port 0)
    echo "    check's Envoy RBAC, rule principals: [spiffe://demo/svc/handler] (beside the module's policy):"
    on_node "$(ns 3)" curl -s "http://127.0.0.1:$admin/stats?filter=^themis_rbac\\.rbac\\." | sed 's/^/      /'
    on_node "$(ns 3)" curl -s "http://127.0.0.1:$admin/stats?filter=^themis_rbac\\.rbac\\.allowed$" | grep -qE ': [1-9]' ||
        fail "check's RBAC admitted nobody"
}

report_access_logs() {
    local hop n service callee log
    section "the sidecars' access logs: where each app meant to go (its original destination)"
    for hop in "2 client handler" "1 handler check"; do
        read -r n service callee <<< "$hop"
        log=$work/n$n/$service-outbound.access
        retry 25 test -s "$log" || fail "$service's sidecar logged nothing"
        echo "    $service's sidecar (node $n):"
        sed 's/^/      /' "$log"
        grep -q "original_dst=${vip[$callee]}:80 " "$log" || fail "$service's sidecar did not get ${vip[$callee]}:80"
    done
}

policy_denied() {
    local code
    section "the policy: the client calls check directly (check admits only 'handler')"
    code=$(in_pod "$(ns 2)" "$(pod_of 2 client)/app" curl -s -m 20 -o "$work/denied.txt" -w '%{http_code}' \
        'http://check/check?n=7') || true
    echo "    HTTP $code: $(head -c 200 "$work/denied.txt")"
    # check's sidecar closes the connection once the caller proved who it is; the
    # client's own sidecar answers 503. Why, is in check's sidecar's log:
    [[ $code == 503 ]] || fail "check's sidecar did not refuse the client"
    # (The Wasm filter logs "closing the connection (policy)", the native module
    # "refused.policy".)
    retry 25 grep -qE "closing the connection \(policy\)|refused\.policy" "$work/n3/check-envoy.log" ||
        fail "check's sidecar did not log a policy refusal"
    echo "    check's sidecar: $(grep -oE "closing the connection \(policy\).*|refused\.policy.*" "$work/n3/check-envoy.log" | head -n1 | cut -c1-160)"
}

log_size() { on "$1" --json log status | json 'v["size"]'; }

# How long the revocation ID, just published through node 1, takes to be enforced by
# each agent (gossip pushes it at once; the bound stated in docs/PROTOCOL.md §6.14 is
# 5 s at p99). Polled every 50 ms, for 30 s at most.
revocation_reach() { # ID
    local id=$1 start n elapsed
    local -A at=()
    start=$(date +%s%N)
    while ((${#at[@]} < 3)); do
        for n in 1 2 3; do
            if [[ -z ${at[$n]:-} ]] && knows_revocation "$n" "$id"; then
                at[$n]=$((($(date +%s%N) - start) / 1000000))
            fi
        done
        elapsed=$((($(date +%s%N) - start) / 1000000))
        ((elapsed < 30000)) || fail "the revocation reached only nodes ${!at[*]} in 30 s"
    done
    echo "    gossip carried it to every agent (the bound: 5 s): node 1 ${at[1]} ms, node 2 ${at[2]} ms, node 3 ${at[3]} ms after node 1 took it"
}
same_log() { [[ $(log_size "$1") == "$(log_size 1)" ]]; }
knows_revocation() { on "$1" --json revocations | json "any(r['id'] == '$2' for r in v['revocations'])" | grep -q True; }

trust_log() {
    local id out n
    section "the trust log: every statement the root signed, under root-signed checkpoints, held and checked by every agent"
    echo "    the operator hands the mesh's log to node 1 (themis log publish); nodes 2 and 3 copy it from their neighbours:"
    "$themis" --socket "$work/n1/agent.sock" log publish --mesh-dir "$work/mesh" | sed 's/^/      /'
    for n in 2 3; do retry 150 same_log "$n" || fail "node $n did not copy the trust log"; done
    echo "    themis log show check, on node 3 (its own copy, each leaf verified against the mesh root):"
    on 3 log show check | report ids-in | sed 's/^/      /'
    id=$(on 2 --json workload doomed | json 'v["id"]')
    echo "$id workload doomed client 2" >> "$work/ids"
    echo "    the operator revokes workload doomed (node 2) and publishes through node 1:"
    "$themis" --socket "$work/n1/agent.sock" revoke "$id" --mesh-dir "$work/mesh" --reason "demo: key stolen" --publish |
        grep -v '^-----\|^[A-Za-z0-9+/=]*$' | report ids-in | sed 's/^/      /'
    revocation_reach "$id"
    retry 150 knows_revocation 2 "$id" || fail "node 2 did not learn the revocation from the log"
    echo "    node 2 took it from the log (a neighbour's copy, checked against the root) and enforces it:"
    if out=$(on 2 register client --workload doomed --endpoint "$(ip_of 2):$(inbound_port 9)" 2>&1); then
        fail "node 2 registered a revoked workload: $out"
    fi
    echo "      themis register client --workload doomed -> ${out#error: }" | report ids-in
    on 2 log status | report ids-in | sed 's/^/    /'
}

impostor_refused() {
    local out
    section "an impostor: node 2 is in the mesh (admitted) but granted only 'client'; it tries to serve 'check'"
    if out=$(on 2 register check --workload evil --endpoint "$(ip_of 2):$(inbound_port 0)" 2>&1); then
        fail "node 2 registered check without a grant: $out"
    fi
    echo "    node 2: themis register check -> refused:"
    echo "      ${out#error: }" | fold -s -w 100 | sed '2,$s/^/      /'
    echo "    what the ring holds for check, and why it is trusted (themis explain check, on node 1):"
    on 1 --json explain check > "$work/explain.json"
    python3 - "$work/explain.json" "$work/ids" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
labels = dict(line.split(" ", 1) for line in open(sys.argv[2]).read().split("\n") if line)
def name(i):
    parts = labels.get(i, "").split()
    if parts[:1] == ["workload"]:
        return f"workload {parts[1]} (node {parts[3]})"
    return " ".join(parts) or (i[:16] + "…" if i else "?")
print(f"      {v['answered']} of {v['replicas']} replica holders answered; checked against the mesh root")
for x in v["values"]:
    print(f"      {x['verdict'].upper():<10} {name(x['id'])} at {x['endpoint']}, endorsed by {name(x['endorser'])}: {x['reason']}")
live = [i["id"] for i in v["instances"]]
if len(live) != 1:
    sys.exit(f"check resolves to {len(live)} instances")
PY
}

bypass_refused() {
    local rc=0
    section "bypassing the sidecars: plain HTTP from node 2 straight to check's app ($(ip_of 3):$(app_port 0))"
    on_node "$(ns 2)" curl -s -m 3 -o /dev/null "http://$(ip_of 3):$(app_port 0)/check?n=7" || rc=$?
    case $rc in
        0) fail "the app port answered a request that bypassed the sidecar" ;;
        28) echo "    timed out (curl -m 3): the capture drops what comes to the app port from the network" ;;
        7) echo "    refused: the app port takes only its own sidecar's connections" ;;
        *) echo "    failed (curl exit $rc)" ;;
    esac
    echo "    while the mesh path above answered 200"
}

# The node's trust boundary: the agent asks the kernel who calls (SO_PEERCRED and the
# caller's cgroup). The pods run as root, as many do; root in a pod is not the operator.
pod_asks_agent() {
    local n=2 app code path
    app=$(pod_of "$n" client)/app
    section "a pod on node 2 calls its node's agent directly (root inside pod client, same socket the sidecar uses)"
    for call in "GET /v1/workloads/client/identity" "GET /v1/workloads/client/key" \
        "GET /v1/workloads/check/identity" "PUT /v1/services/check/instances/evil" "POST /v1/debug/store"; do
        path=${call#* }
        code=$(in_pod "$(ns "$n")" "$app" curl -s -m 5 -o "$work/pod-call.json" -w '%{http_code}' \
            --unix-socket "$work/n$n/agent.sock" -X "${call%% *}" -H 'content-type: application/json' \
            -d '{"endpoint":"10.0.0.2:1","name":"check","value":"x"}' "http://agent$path") || true
        case "$call:$code" in
            *client/identity:200) echo "    $call -> 200: its own workload's public identity (the pod's cgroup is the workload's)" ;;
            *client/identity:*) fail "pod client was refused its own identity ($code): $(cat "$work/pod-call.json")" ;;
            *client/key:403) echo "    $call -> 403 $(json 'v["reason"]' < "$work/pod-call.json"): the private key never leaves the agent, which signs for the sidecar (wasm) or delegates it a short-lived key (native)" ;;
            *:403) echo "    $call -> 403 $(json 'v["reason"]' < "$work/pod-call.json")" ;;
            *) fail "$call from a pod answered $code: $(cat "$work/pod-call.json")" ;;
        esac
    done
    echo "    counted by node 2's agent:"
    on_node "$(ns "$n")" curl -s 127.0.0.1:9464/metrics | grep '^themis_api_refused_total' | sed 's/^/      /'
    echo "    (each refusal is also in node 2's agent log, with the caller's pid, uid and cgroup)"
}

report_counters() {
    local n
    section "the capture's counters (themis capture)"
    for n in 1 2 3; do
        echo "    node $n: $(on "$n" capture | sed -n 's/^ *counters: //p')"
    done
    if ((${#fast_path[@]})); then
        echo "    fast path on: fast_path_sockets counts the sockets it joined; $ONE_LINE_FAST_PATH"
    else
        echo "    (--fast-path: $ONE_LINE_FAST_PATH)"
    fi
}

# --- a kept mesh ---------------------------------------------------------------------------
keep_mesh() {
    local me=scripts/demo.sh
    {
        echo "name=$name"
        echo "work=$work"
        echo "base_id=$base_id"
        echo "fast_path=(${fast_path[*]})"
        echo "runtime=$runtime"
        echo "transport=$transport"
    } > "$STATE"
    keep_on_exit=1
    section "the mesh keeps running (--keep); try:"
    cat << EOF
    $me pod client curl -s -d hello 'http://handler/check?n=7'   # a call, as the client app
    $me node 1 themis resolve check              # node 1's agent: check's instances
    $me node 1 themis ring                       # its place in the ring
    $me node 3 curl -s 127.0.0.1:9464/metrics | grep '^themis_'           # agent metrics
    $me node 3 curl -s 127.0.0.1:15000/stats | grep themis   # check's sidecar (Envoy's and the Wasm roles' counters)
    $me add-check                                # a second check instance (check-2, node 2)
    $me calls 20                                 # 20 calls: which check instance answered
    $me kill-node 3                              # node 3 dies (agent, check's pod)
    $me calls 20                                 # calls fall back to check-2
    $me node 1 curl -s 127.0.0.1:15000/stats | grep peer_unreachable   # handler's sidecar: fallbacks
    $me --down                                   # remove everything

    (pod runs a command as a process of the pod's app cgroup in the node's network
    namespace, so the capture applies; node runs it in node N's network namespace with
    THEMIS_SOCKET=$work/nN/agent.sock. Logs: $work/n*/)
EOF
}

load_state() {
    [[ -f $STATE ]] || fail "no kept mesh ($STATE is missing): scripts/demo.sh --keep first"
    # shellcheck disable=SC1090 # written by keep_mesh
    source "$STATE"
    transport=${transport:-themis} # a mesh kept before --transport
    set_names "$name"
    binaries
    full_ids=0
}

pod_node() { # WORKLOAD -> "N SLOT"
    local workload service n slot
    while read -r workload service n slot; do
        [[ $workload == "$1" ]] && { echo "$n $slot"; return; }
    done < "$work/pods"
    fail "no pod $1 (pods: $(cut -d' ' -f1 "$work/pods" | paste -sd' '))"
}

cmd_pod() { # WORKLOAD CMD...
    local where
    where=$(pod_node "$1")
    in_pod "$(ns "${where% *}")" "$(pod_of "${where% *}" "$1")/app" "${@:2}"
}

cmd_node() { # N CMD...
    [[ $1 =~ ^[123]$ ]] || fail "nodes are 1, 2 and 3"
    on_node "$(ns "$1")" env THEMIS_SOCKET="$work/n$1/agent.sock" PATH="$(dirname "$themis"):$PATH" "${@:2}"
}

cmd_add_check() {
    grep -q '^check-2 ' "$work/pods" && fail "check-2 is there already"
    step "the operator grants check to node 2 (offline); node 2 registers a second check instance, check-2"
    grant check 2
    start_pod check check-2 2 1 '{"allow":[{"service":"handler"}]}'
    start_app check-2 2 1 --role check
    retry 50 resolves 1 check 2 || fail "node 1 does not resolve two check instances"
    on 1 --json resolve check --fresh > "$work/resolve-check.json"
    report resolve "$work/resolve-check.json" | indent
    echo "    waiting for handler's sidecar to see it (it reuses a resolution for resolve_ttl_secs, 10 s)"
    retry 100 answered_by check-2 || fail "handler's sidecar did not call check-2 within 20 s"
    echo "    handler's sidecar now picks one of the two at random per call"
}

# Whether a call client -> handler -> check is answered by WORKLOAD's instance.
answered_by() { # WORKLOAD
    local id
    id=$(awk -v w="$1" '$2 == "workload" && $3 == w { print $1 }' "$work/ids")
    in_pod "$(ns 2)" "$(pod_of 2 client)/app" curl -s -m 5 'http://handler/check?n=1' |
        json 'v["check"]["peer_id"]' | grep -qx "$id"
}

cmd_calls() { # [N]
    local count=${1:-20} i dir
    dir=$(mktemp -d "$work/calls.XXXXXX")
    for i in $(seq "$count"); do
        in_pod "$(ns 2)" "$(pod_of 2 client)/app" curl -s -m 20 -o "$dir/$i.json" "http://handler/check?n=$i" || true
    done
    echo "$count calls client -> handler -> check:"
    report calls "$dir"/*.json
    rm -rf "$dir"
}

cmd_kill_node() { # N
    local n=$1 pids
    [[ $n =~ ^[123]$ ]] || fail "nodes are 1, 2 and 3"
    pids=$(recorded_pids "n$n *")
    [[ -n $pids ]] || fail "node $n has nothing running"
    # shellcheck disable=SC2086 # a list of pids
    kill -KILL $pids
    echo "    node $n: agent and pods killed (pids $(paste -sd' ' <<< "$pids")); its records expire from the ring within their TTL,"
    echo "    and callers that try its instance first fall back to the next one"
}

cmd_down() {
    local left
    load_state
    step "tearing down the kept mesh $name"
    set +e # as in the exit trap: remove all that can be removed
    teardown
    set -e
    left=$(
        ip netns list | grep -F "$name" || true
        ls -d /sys/fs/bpf/"$name"-* "$CGROUP_FS/$name" /etc/netns/"$name"-* 2> /dev/null || true
    )
    [[ -z $left ]] || fail "left behind: $left"
    echo "    removed: processes, namespaces, /etc/netns entries, cgroups, bpffs pins, $work"
}

# --- main ----------------------------------------------------------------------------------
run_demo() {
    echo "scripts/demo.sh: a three-node Themis mesh with eBPF capture. The first run takes about 10 minutes on 2 cores (set-up, then a release build with cargo's progress); later runs about a minute."
    ((EUID == 0)) || fail "the demo needs root (namespaces, cgroups, eBPF)"
    if ((keep)) && [[ -f $STATE ]]; then
        fail "a kept mesh is running ($STATE): scripts/demo.sh --down first"
    fi
    trap on_exit EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    set_up_machine
    binaries
    build
    work=$(mktemp -d "/tmp/themis-demo-$$.XXXXXX")
    set_names "themis-demo-$$"
    base_id=$(($$ % 10000 * 100))
    operator
    nodes
    agents
    pods
    report_ring
    report_services
    report_capture
    call_through_mesh
    envoy_sees_the_peer
    report_access_logs
    policy_denied
    impostor_refused
    trust_log
    bypass_refused
    pod_asks_agent
    report_counters
    if ((keep)); then keep_mesh; else section "done"; fi
}

fast_path=()
runtime=native
transport=
full_ids=0
keep=0
case "${1:-}" in
    --down) cmd_down; exit ;;
    pod | node | add-check | calls | kill-node)
        command=${1//-/_}
        shift
        load_state
        "cmd_$command" "$@"
        exit
        ;;
esac
while (($#)); do
    case $1 in
        --fast-path) fast_path=(--fast-path) ;;
        --runtime)
            runtime=${2:-}
            [[ $runtime == native || $runtime == wasm ]] || { echo "$0: --runtime native|wasm" >&2; exit 2; }
            shift ;;
        --transport)
            transport=${2:-}
            [[ $transport == themis || $transport == tls ]] || { echo "$0: --transport themis|tls" >&2; exit 2; }
            shift ;;
        --full-ids) full_ids=1 ;;
        --keep) keep=1 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "usage: $0 [--runtime native|wasm] [--transport themis|tls] [--fast-path] [--full-ids] [--keep] | --down | pod|node|add-check|calls|kill-node ... (see --help)" >&2; exit 2 ;;
    esac
    shift
done
# The native runtime on Envoy's own TLS unless told otherwise (benchmarks/RESULTS.md:
# the faster of its two transports, and the one Envoy's RBAC and logs see); Wasm
# speaks the paper's channel.
[[ -n $transport ]] || { [[ $runtime == native ]] && transport=tls || transport=themis; }
[[ $transport == themis || $runtime == native ]] || { echo "$0: --transport tls is the native runtime's" >&2; exit 2; }
run_demo
