#!/usr/bin/env bash
# The main job: a Themis mesh of three nodes on this one machine.
#
#   node 1 (10.77.0.1)  handler   its app calls http://check/check?n=… by plain URL
#   node 2 (10.77.0.2)  client    curl http://handler/check?n=7
#   node 3 (10.77.0.3)  check     answers with what it got, the caller's verified id too
#
# Each node is a network namespace on a shared bridge and runs a host agent; the
# agents form the DHT ring. Each workload is a "pod": a cgroup with its app and its
# sidecar Envoy (the Themis filter). Service names resolve to virtual IPs that nothing
# answers (like Kubernetes ClusterIPs): the agents' eBPF capture sends the apps'
# connections to their sidecar, which resolves the service through the ring,
# authenticates the instance by its self-certifying id and seals the request. The app
# port takes connections only from the local sidecar.
#
#   scripts/demo.sh [--fast-path]     (root; --fast-path: the agents' sk_msg fast path)
#
# Everything it creates (namespaces, /etc/netns entries, cgroups, bpffs pins, files)
# is named themis-demo-<pid> and removed on exit, error or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

fast_path=()
case "${1:-}" in
    --fast-path) fast_path=(--fast-path) ;;
    "") ;;
    *) echo "usage: $0 [--fast-path]" >&2; exit 2 ;;
esac

scripts/setup.sh --quick
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=scripts/lib/netns.sh
source scripts/lib/netns.sh

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
indent() { sed 's/^/    /'; }
fail() { printf '\033[1mFAIL:\033[0m %s\n' "$*" >&2; exit 1; }
json() { python3 -c "import json,sys; v=json.load(sys.stdin); print($1)"; }

# --- names: unique per run (two runs do not collide), short enough for links -------
name=themis-demo-$$
fab=$name-fab
ns() { echo "$name-n$1"; }
ip_of() { echo "10.77.0.$1"; }
pod_of() { echo "$CGROUP_FS/$name/n$1/$2"; }
pin_dir() { echo "/sys/fs/bpf/$name-n$1"; }
declare -A vip=([check]=10.96.0.10 [handler]=10.96.0.11 [client]=10.96.0.12)
declare -A node_of=([handler]=1 [client]=2 [check]=3)
app_port=8080 outbound=127.0.0.1:15001 inbound_port=15006 admin=127.0.0.1:15000

work=""
netns_made=0
registered=() # "node service workload", to deregister (which detaches the capture)
cleanup() {
    local status=$? reg n service workload i pods=() agents=()
    trap '' INT TERM
    set +e
    if ((status != 0 && status != 130 && status != 143)) && [[ -n $work ]]; then
        echo "--- the demo failed (exit $status); the end of each log:"
        for log in "$work"/*/*.log; do [[ -s $log ]] && { echo "--- $log"; tail -n 12 "$log"; }; done
    fi
    echo "==> cleaning up"
    for reg in "${registered[@]}"; do
        read -r n service workload <<< "$reg"
        timeout 5 "$themis" --socket "$work/n$n/agent.sock" deregister "$service" --workload "$workload" > /dev/null 2>&1
    done
    # The pods first, then the agents (which leave the ring gracefully on SIGTERM).
    for i in "${!pids[@]}"; do
        if [[ ${pid_names[$i]} == agent* ]]; then agents+=("${pids[$i]}"); else pods+=("${pids[$i]}"); fi
    done
    stop_pids "${pods[@]}"
    stop_pids "${agents[@]}"
    cgroup_remove "$CGROUP_FS/$name"
    ((netns_made)) && netns_down "$(ns 1)" "$(ns 2)" "$(ns 3)" "$fab"
    # Capture links are pinned to outlive their agent: unpinning is what detaches the
    # rest (an agent stopped by Ctrl-C before it could deregister).
    rm -rf /sys/fs/bpf/"$name"-*
    [[ -n $work ]] && rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- build -----------------------------------------------------------------------------
target=${CARGO_TARGET_DIR:-target}
[[ $target == /* ]] || target=$repo/$target
step "building the agent (with the eBPF capture) and the Envoy filter (release)"
cargo build -q --release -p themis-agent --bins
cargo build -q --release -p themis-envoy --target wasm32-wasip1
themis=$target/release/themis
wasm=$target/wasm32-wasip1/release/themis_envoy.wasm
envoy=$repo/.venv/bin/envoy
on() { local n=$1; shift; "$themis" --socket "$work/n$n/agent.sock" "$@"; }
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

# --- the nodes -------------------------------------------------------------------------
step "three nodes: network namespaces $(ns 1)..3 on a bridge (10.77.0.0/24)"
work=$(mktemp -d "/tmp/$name.XXXXXX")
netns_made=1
fabric_up "$fab" "$(ns 1)=$(ip_of 1)/24" "$(ns 2)=$(ip_of 2)/24" "$(ns 3)=$(ip_of 3)/24"
hosts=()
for service in check handler client; do hosts+=("${vip[$service]} $service"); done
for n in 1 2 3; do
    hosts_file "$(ns "$n")" "${hosts[@]}"
    mkdir -p "$work/n$n"
done
echo "    service IPs, in every node's /etc/hosts: $(printf '%s, ' "${hosts[@]}" | sed 's/, $//')"
echo "    (nothing routes or answers there: connections to them work only through the capture)"

start_agent() { # n [join]
    local n=$1
    spawn "agent n$n" "$(ns "$n")" - "$work/n$n/agent.log" \
        "$themis" agent --mesh demo --state-dir "$work/n$n" --listen "$(ip_of "$n"):7000" \
        --metrics 127.0.0.1:9464 --stabilise-ms 250 ${2:+--join "$2"} \
        --capture --bpf-pin-dir "$(pin_dir "$n")" "${fast_path[@]}"
    retry_while "$last_pid" 100 on "$n" status || fail "node $n's agent did not start"
}
joined() { on "$1" --json status | json 'v["joined"]' | grep -q True; }

step "a host agent per node, with the capture (mesh 'demo'${fast_path:+, fast path on})"
start_agent 1
bootstrap=$(on 1 --json status | json 'v["id"]+"@"+v["listen"]')
echo "==> node 1 started the ring: $bootstrap"
for n in 2 3; do
    start_agent "$n" "$bootstrap"
    retry 100 joined "$n" || fail "node $n did not join"
    echo "==> node $n joined: $(on "$n" --json status | json 'v["id"]+"@"+v["listen"]')"
done
sleep 1 # a few stabilisation rounds

# --- the pods --------------------------------------------------------------------------
# A pod: its cgroup; its registration (the agent creates the workload's key, attaches
# the capture to the pod's cgroup, the proxy's exempt, then signs and stores the
# record); then its sidecar Envoy in <pod>/proxy.
start_pod() { # service [policy]
    local service=$1 policy=${2:-} n pod
    n=${node_of[$service]}
    pod=$(pod_of "$n" "$service")
    pod_cgroup "$pod"
    on "$n" register "$service" --workload "$service" --endpoint "$(ip_of "$n"):$inbound_port" \
        --cgroup "$pod" --proxy-cgroup "$pod/proxy" --outbound "$outbound" --inbound-port "$app_port" \
        > "$work/n$n/register-$service.txt" 2>&1 || fail "registering $service: $(cat "$work/n$n/register-$service.txt")"
    registered+=("$n $service $service")
    scripts/render-sidecar --mesh demo --workload "$service" --service "$service" \
        --agent-socket "$work/n$n/agent.sock" --app "127.0.0.1:$app_port" --outbound "$outbound" \
        --inbound "$(ip_of "$n"):$inbound_port" --admin-port "${admin#*:}" --wasm "$wasm" \
        --access-log "$work/n$n/$service-outbound.access" ${policy:+--policy "$policy"} \
        > "$work/n$n/$service-envoy.yaml"
    spawn "envoy $service" "$(ns "$n")" "$pod/proxy" "$work/n$n/$service-envoy.log" \
        "$envoy" -c "$work/n$n/$service-envoy.yaml" --concurrency 1 --disable-hot-restart \
        --base-id "$(($$ % 100000 * 10 + n))" -l warn
    retry_while "$last_pid" 300 on_node "$(ns "$n")" curl -sf "http://$admin/ready" ||
        fail "$service's Envoy did not become ready"
    echo "    $service on node $n: pod $pod, its sidecar ready"
}

# An app in its pod, on the app port on every address, as a pod's server would be.
start_app() { # service args...
    local service=$1 n
    shift
    n=${node_of[$service]}
    spawn "app $service" "$(ns "$n")" "$(pod_of "$n" "$service")/app" "$work/n$n/$service-app.log" \
        python3 "$repo/scripts/demo-app.py" "$@" 0.0.0.0 "$app_port"
    retry_while "$last_pid" 50 grep -q listening "$work/n$n/$service-app.log" || fail "$service's app did not start"
}

step "pods: a cgroup each (app, proxy), registered with the capture, a sidecar Envoy"
start_pod check '{"allow":[{"service":"handler"}]}'
start_app check --role check
start_pod handler '{"allow":[{"service":"client"}]}'
start_app handler --role handler --upstream http://check
start_pod client
echo "    policies: check admits callers verified as 'handler', handler admits 'client'"

# Registrations travel through the ring; wait until the callers can resolve them.
resolves() { on "$1" --json resolve "$2" --fresh | json 'len(v["instances"])' | grep -qv '^0$'; }
for pair in "2 handler" "1 check" "3 handler" "1 client"; do
    # shellcheck disable=SC2086 # node and service, as two words
    retry 50 resolves $pair || fail "node ${pair% *} cannot resolve ${pair#* }"
done

# --- the report ------------------------------------------------------------------------
step "the ring: three agents, every message between them over the Themis channel"
for n in 1 2 3; do
    echo "    node $n: $(on "$n" --json status | json 'v["id"]+"  "+v["listen"]')"
done

step "services and their instances (themis resolve, on node 1)"
declare -A id_of
for service in check handler client; do
    on 1 resolve "$service" | indent
    id_of[$service]=$(on 1 --json resolve "$service" | json 'v["instances"][0]["id"]')
done

step "the capture: what each agent attached to its pod (themis capture)"
for n in 1 2 3; do
    echo "    node $n:"
    on "$n" capture | grep -v counters: | sed 's/^/      /'
done

step "a request through the mesh: node 2's client runs curl http://handler/check?n=7"
client_app=$(pod_of 2 client)/app
answer=$work/answer.json
code=$(in_pod "$(ns 2)" "$client_app" curl -s -m 20 -o "$answer" -w '%{http_code}' \
    'http://handler/check?n=7') || true
[[ $code == 200 ]] || fail "the client got HTTP $code: $(cat "$answer" 2> /dev/null)"
python3 - "$answer" "${id_of[client]}" "${id_of[handler]}" "${id_of[check]}" << 'EOF' | indent
import json, sys
a = json.load(open(sys.argv[1]))
client, handler, check = sys.argv[2:5]
c = a["check"]
print(f"200 from handler, which got the request from {a['peer_id']} (service {a['peer_service']})")
print(f"handler called {c['url']}; its sidecar authenticated {c['peer_id']} (service {c['peer_service']})")
print(f"check got the request from {c['answer']['peer_id']} (service {c['answer']['peer_service']})")
print(f"check's answer: {json.dumps({k: c['answer'][k] for k in ('method', 'path', 'n', 'prime')})}")
ok = (a["peer_id"], a["peer_service"]) == (client, "client") \
    and (c["peer_id"], c["peer_service"]) == (check, "check") \
    and (c["answer"]["peer_id"], c["answer"]["peer_service"]) == (handler, "handler")
print("every id is the one the ring resolves for that service" if ok else "MISMATCH with the resolved ids")
sys.exit(0 if ok else 1)
EOF

step "the sidecars' access logs: where each app meant to go (its original destination)"
for hop in "2 client handler" "1 handler check"; do
    read -r n service callee <<< "$hop"
    log=$work/n$n/$service-outbound.access
    retry 25 test -s "$log" || fail "$service's sidecar logged nothing"
    echo "    $service's sidecar (node $n):"
    sed 's/^/      /' "$log"
    grep -q "original_dst=${vip[$callee]}:80 " "$log" || fail "$service's sidecar did not get ${vip[$callee]}:80"
done

step "the policy: the client calls check directly (check admits only 'handler')"
code=$(in_pod "$(ns 2)" "$client_app" curl -s -m 20 -o "$work/denied.txt" -w '%{http_code}' \
    'http://check/check?n=7') || true
echo "    HTTP $code: $(head -c 200 "$work/denied.txt")"
[[ $code == 403 ]] || fail "check's sidecar did not refuse the client"

step "bypassing the sidecars: plain HTTP from node 2 straight to check's app ($(ip_of 3):$app_port)"
rc=0
on_node "$(ns 2)" curl -s -m 3 -o /dev/null "http://$(ip_of 3):$app_port/check?n=7" || rc=$?
case $rc in
    0) fail "the app port answered a request that bypassed the sidecar" ;;
    28) echo "    timed out (curl -m 3): the capture drops what comes to the app port from the network" ;;
    7) echo "    refused: the app port takes only its own sidecar's connections" ;;
    *) echo "    failed (curl exit $rc)" ;;
esac
echo "    while the mesh path above answered 200"

step "the capture's counters (themis capture)"
for n in 1 2 3; do
    echo "    node $n: $(on "$n" capture | sed -n 's/^ *counters: //p')"
done

step "done"
