#!/usr/bin/env bash
# The main job, for now: a local mesh of three host agents on loopback. They form a
# Themis DHT ring (every message between them over the secure channel); `check`
# registers on node 3 with an identity its agent creates; `handler` on node 1 resolves
# `check` by name through the ring, gets its endpoint and self-certifying id, and
# calls it over the Themis channel. An impostor listening elsewhere is refused, and a
# node leaving gracefully loses nothing. (Envoy and the eBPF capture come with the next
# issues.)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --quick
export PATH="$HOME/.cargo/bin:$PATH"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "building the agent and the demo apps (release)"
cargo build -q --release -p themis-agent --bins
cargo build -q --release -p themis-net --example tcp_demo
cargo build -q --release -p themis-envoy --target wasm32-wasip1
wasm=target/wasm32-wasip1/release/themis_envoy.wasm
themis=target/release/themis
demo=target/release/examples/tcp_demo

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# A free loopback port, asked of the kernel.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
json() { python3 -c "import json,sys; v=json.load(sys.stdin); print($1)"; }
on() { local n=$1; shift; "$themis" --socket "$work/node$n/agent.sock" "$@"; }

start_agent() { # n [join]
    local n=$1 port
    port=$(free_port)
    "$themis" agent --mesh demo --state-dir "$work/node$n" --listen "127.0.0.1:$port" \
        --metrics "${metrics[$n]}" --stabilise-ms 250 ${2:+--join "$2"} > "$work/node$n.log" 2>&1 &
    pids[$n]=$!
    for _ in $(seq 100); do on "$n" status > /dev/null 2>&1 && return; sleep 0.1; done
    echo "node $n did not start:"; cat "$work/node$n.log"; exit 1
}

step "starting three host agents on 127.0.0.1 (mesh 'demo')"
metrics=(off "127.0.0.1:$(free_port)" off off)
admin_port=()
start_agent 1
bootstrap=$(on 1 --json status | json 'v["id"]+"@"+v["listen"]')
start_agent 2 "$bootstrap"
start_agent 3 "$bootstrap"
for n in 1 2 3; do
    for _ in $(seq 100); do [ "$(on "$n" --json status | json 'v["joined"]')" = True ] && break; sleep 0.1; done
    on "$n" status | head -3 | sed "s/^/  node $n: /"
done
sleep 1   # a few stabilisation rounds
echo "--- the ring as node 1 sees it (themis ring):"
on 1 ring | sed 's/^/  /'

step "check: node 3 creates its identity and registers it (signed record, 3 replicas)"
check_port=$(free_port)
on 3 workload check
"$demo" serve demo "$work/node3/workloads/check.key" "127.0.0.1:$check_port" > "$work/check.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do grep -q listening "$work/check.log" && break; sleep 0.1; done
on 3 register check --workload check --endpoint "127.0.0.1:$check_port" --meta version=v1

step "handler on node 1 resolves 'check' through the DHT"
on 1 workload handler
on 1 resolve check
endpoint=$(on 1 --json resolve check | json 'v["instances"][0]["endpoint"]')
check_id=$(on 1 --json resolve check | json 'v["instances"][0]["id"]')

step "handler calls check over the Themis channel, authenticating it by the resolved id"
"$demo" call demo "$work/node1/workloads/handler.key" "$endpoint" "$check_id" \
    "is 7 prime?" "GET /check?n=7 HTTP/1.1"
sleep 0.2
echo "--- check's log:"
sed 's/^/  /' "$work/check.log"

step "an impostor with its own key listens elsewhere; handler expects the resolved id"
"$demo" keygen demo "$work/impostor.key" > /dev/null
impostor_port=$(free_port)
"$demo" serve demo "$work/impostor.key" "127.0.0.1:$impostor_port" > "$work/impostor.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do grep -q listening "$work/impostor.log" && break; sleep 0.1; done
if "$demo" call demo "$work/node1/workloads/handler.key" "127.0.0.1:$impostor_port" "$check_id" "secret" 2> "$work/refused.txt"; then
    echo "FAIL: the handler talked to an impostor"; exit 1
fi
echo "handler refused: $(cat "$work/refused.txt")"

step "sidecar Envoys with the Themis filter: handler (node 1) calls http://check/ by name"
echo "check moves behind its sidecar: its app on 127.0.0.43:8080, its Envoy's inbound listener registered"
python3 scripts/demo-app.py 127.0.0.43 8080 > "$work/check-app.log" 2>&1 &
pids+=($!)
on 3 register check --workload check --endpoint 127.0.0.43:15006
on 1 resolve check --fresh > /dev/null   # node 1 cached the old endpoint a moment ago
echo "handler registers too (its sidecar's inbound listener), so check can verify its service"
on 1 register handler --workload handler --endpoint 127.0.0.41:15006
sidecar() { # node workload address [policy]
    local admin
    admin=$(free_port)
    scripts/render-sidecar --mesh demo --workload "$2" --service "$2" \
        --agent-socket "$work/node$1/agent.sock" --app "$3:8080" --outbound "$3:15001" \
        --inbound "$3:15006" --admin-port "$admin" --wasm "$wasm" ${4:+--policy "$4"} > "$work/envoy$1.yaml"
    .venv/bin/envoy -c "$work/envoy$1.yaml" --concurrency 2 --disable-hot-restart \
        --base-id $((900 + $1)) -l warn > "$work/envoy$1.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do curl -sf "127.0.0.1:$admin/ready" > /dev/null && break; sleep 0.1; done
    curl -sf "127.0.0.1:$admin/ready" > /dev/null || { echo "Envoy $1 did not start:"; cat "$work/envoy$1.log"; exit 1; }
    admin_port[$1]=$admin
}
sidecar 1 handler 127.0.0.41
sidecar 3 check 127.0.0.43 '{"allow":[{"service":"handler"}]}'
echo "check's policy: allow callers verified as service 'handler'"
echo "--- curl -H 'Host: check' http://127.0.0.41:15001/check?n=7 (handler's outbound listener)"
curl -s -i --retry 10 --retry-delay 1 --retry-all-errors -X POST http://127.0.0.41:15001/check?n=7 \
    -H 'Host: check' -d 'is 7 prime?' | sed 's/^/  /'
echo
echo "--- a plaintext request straight to check's inbound listener:"
curl -s -i http://127.0.0.43:15006/check -H 'Host: check' | sed -n '1p;/x-themis-reject/p' | sed 's/^/  /'
echo "--- check's sidecar metrics (non-zero):"
curl -s "127.0.0.1:${admin_port[3]}/stats" | grep '^wasmcustom.themis' | grep -v ': 0$' | sed 's/^/  /'

step "node 2 leaves gracefully (SIGTERM): what it held moves to its successor"
kill -TERM "${pids[2]}"; wait "${pids[2]}" 2>/dev/null || true
grep -h "left the ring" "$work/node2.log" | sed 's/^/  /'
on 1 resolve check --fresh

step "node 1's Prometheus metrics (excerpt)"
curl -s "http://${metrics[1]}/metrics" | grep -E '^themis_(handshakes|dht_operations|sessions|ring_joined|resolve_cache)' | sed 's/^/  /'

step "done: a ring of agents, signed registration, resolution by name, authenticated and sealed calls (Themis channel, and Envoy sidecars with the filter)"
