#!/usr/bin/env bash
# The Themis scenario of run.sh: two nodes on loopback, admitted to mesh "bench" by an
# operator step, each with a host agent and a sidecar Envoy running the Themis filter
# (deploy/envoy/sidecar.yaml), handler on A calling check on B, whose app is run.sh's
# fortio server ($APP_ADDR).
#
#   themis-pair.sh build   build the agent and the filter (release)
#   themis-pair.sh start   start both nodes in the background; print address= and host=
#   themis-pair.sh stats   the Themis counters of both Envoys (handshakes, sessions, refusals)
#   themis-pair.sh stop    stop what start started, by PID
#
# Environment (set by run.sh): THEMIS_BENCH_DIR, APP_ADDR, APP_GRPC_ADDR, ENVOY,
# ENVOY_CONCURRENCY, REPO_ROOT, THEMIS_ONE_REQUEST_PER_CONNECTION (1: run.sh
# --one-request-per-connection), THEMIS_RUNTIME (wasm, the default; native: the
# sidecars seal with the Envoy dynamic module; tls: Envoy's own TLS 1.3 with the module
# as its certificate validator, certificates from the agent's SDS), THEMIS_SIDECAR_TEMPLATE (optional: a
# template to render instead of the runtime's own; benchmarks/envoy/ab.sh). gRPC calls go to service `ping`
# (fortio's gRPC port).
set -euo pipefail
ROOT=${REPO_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
THEMIS=$TARGET/release/themis
WASM=$TARGET/wasm32-wasip1/release/themis_envoy.wasm
NATIVE=$TARGET/release/libthemis_native.so
RUNTIME=${THEMIS_RUNTIME:-wasm}
DIR=${THEMIS_BENCH_DIR:-/tmp/themis-pair}
A=127.0.0.11 B=127.0.0.12

case "${1:-}" in
build)
    cargo build -q --release -p themis-cli --bin themis
    cargo build -q --release -p themis-envoy --target wasm32-wasip1
    cargo build -q --release -p themis-native
    ;;
start)
    [[ -x $THEMIS && -f $WASM && -f $NATIVE ]] || { echo "run: $0 build" >&2; exit 1; }
    native=() takes=()
    [[ $RUNTIME == native || $RUNTIME == tls ]] && native=(--runtime "$RUNTIME" --calls check --calls ping)
    # A TLS sidecar's record says so: its callers pick the transport from it.
    [[ $RUNTIME == tls ]] && takes=(--transport tls)
    # A fresh mesh each start (run.sh starts the pair once per round in the same DIR).
    rm -rf "$DIR/mesh" "$DIR/a" "$DIR/b" "$DIR"/*.log "$DIR"/*.yaml
    mkdir -p "$DIR"
    on() { local n=$1; shift; "$THEMIS" --socket "$DIR/$n/agent.sock" "$@"; }
    # The operator: mesh "bench", nodes a (handler) and b (check) admitted and granted.
    "$THEMIS" mesh create bench --out "$DIR/mesh" > /dev/null
    for node in a:handler b:check b:ping; do
        [[ -d $DIR/${node%:*} ]] || "$THEMIS" node admit --mesh-dir "$DIR/mesh" --out "$DIR/${node%:*}" > /dev/null
        "$THEMIS" service grant "${node#*:}" --mesh-dir "$DIR/mesh" --node "$DIR/${node%:*}" > /dev/null
    done
    agent() { # name address [join]
        "$THEMIS" agent --state-dir "$DIR/$1" --listen "$2:7101" --metrics off \
            --stabilise-ms 250 ${3:+--join "$3"} > "$DIR/agent-$1.log" 2>&1 &
        echo $! >> "$DIR/pids"
        for _ in $(seq 100); do on "$1" status > /dev/null 2>&1 && return; sleep 0.1; done
        echo "agent $1 did not start" >&2; exit 1
    }
    agent a $A
    agent b $B "$(on a --json status | python3 -c 'import json,sys; v=json.load(sys.stdin); print(v["id"]+"@"+v["listen"])')"
    for _ in $(seq 100); do
        [[ $(on b --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["joined"])') == True ]] && break
        sleep 0.1
    done
    on a workload handler > /dev/null
    on b workload check > /dev/null
    on a register handler --workload handler --endpoint $A:15006 "${takes[@]}" > /dev/null
    on b register check --workload check --endpoint $B:15006 "${takes[@]}" > /dev/null
    # gRPC: fortio's ping service, behind a sidecar of its own (HTTP/2 to the app).
    on b workload ping > /dev/null
    on b register ping --workload ping --endpoint $B:15016 "${takes[@]}" > /dev/null
    sidecar() { # node workload address admin-port app outbound-port inbound-port app-protocol
        "$THEMIS" sidecar render --mesh-root "$DIR/mesh/mesh.root" --workload "$2" --service "$2" \
            --agent-socket "$DIR/$1/agent.sock" --app "$5" --app-protocol "$8" \
            --outbound "$3:$6" --inbound "$3:$7" --admin-port "$4" --wasm "$WASM" --unpinned \
            --policy '{"allow":[{"service":"handler"}]}' "${native[@]}" \
            ${THEMIS_SIDECAR_TEMPLATE:+--template "$THEMIS_SIDECAR_TEMPLATE"} > "$DIR/envoy-$2.yaml"
        # run.sh --one-request-per-connection: a new sealed connection per request.
        if [[ ${THEMIS_ONE_REQUEST_PER_CONNECTION:-0} == 1 ]]; then
            python3 "$ROOT/benchmarks/envoy/one-request-per-connection.py" \
                '^(themis_tls|themis_seal|themis_to_.*)$' "$DIR/envoy-$2.yaml" 2> /dev/null
        fi
        ENVOY_DYNAMIC_MODULES_SEARCH_PATH=$(dirname "$NATIVE") "${ENVOY:-.venv/bin/envoy}" -c "$DIR/envoy-$2.yaml" --concurrency "${ENVOY_CONCURRENCY:-2}" \
            --disable-hot-restart --base-id $((4000 + $4 % 1000)) -l warn \
            > "$DIR/envoy-$2.log" 2>&1 &
        echo $! >> "$DIR/pids"
        for _ in $(seq 100); do curl -sf "127.0.0.1:$4/ready" > /dev/null && return; sleep 0.1; done
        echo "envoy $1 did not become ready" >&2; exit 1
    }
    # pids 3 and 4 are the measured pair (run.sh reads its CPU time).
    sidecar a handler $A 15301 "$A:8080" 15001 15006 http1
    sidecar b check $B 15302 "${APP_ADDR:-127.0.0.12:8080}" 15001 15006 http1
    sidecar b ping $B 15303 "${APP_GRPC_ADDR:-127.0.0.12:8079}" 15011 15016 http2
    echo "address=$A:15001"
    echo "host=check"
    echo "grpc_host=ping"
    ;;
stats)
    for side in a:15301 b:15302 b-ping:15303; do
        printf 'envoy %s: ' "${side%:*}"
        # The filter's counters (Wasm or native) and what each sealing cluster carried.
        { curl -s -m 2 "127.0.0.1:${side#*:}/stats?filter=^(wasm|dynamicmodules)custom\\.themis\\.|^cluster\\.themis_(seal|to_|tls).*\\.upstream_(rq|cx)_total" \
            | sed -E 's/^(wasm|dynamicmodules)custom\.themis\.//' | grep -v ': 0$' || true; } | tr '\n' ' '
        echo
    done
    ;;
stop)
    [[ -f $DIR/pids ]] || exit 0
    tac "$DIR/pids" | while read -r pid; do
        kill "$pid" 2> /dev/null || continue
        for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2> /dev/null || true
    done
    rm -f "$DIR/pids"
    ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
    exit 2
    ;;
esac
