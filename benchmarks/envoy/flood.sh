#!/usr/bin/env bash
# Issue 13: do floods of message 1 starve real traffic? Starts the real Themis pair
# (themis-pair.sh: agents, sidecars, fortio server as check's app), then runs the same
# legitimate Fortio load (handler -> check through both sidecars) three times:
#
#   baseline   no flood
#   one-src    with hello_flood from ONE source address (127.0.0.50): fresh and replayed
#              Hellos as fast as it can (the per-source bucket refuses most of them)
#   many-src   with hello_flood spread over 64 source addresses (127.0.0.50-113): the
#              buckets admit far more, so replays meet the replay cache and fresh Hellos
#              cost a full answer (signature check, key share, agent signature) until
#              the worker's handshake budget is spent (defaults: 200/s, burst 400 per
#              worker, half reserved for known-good sources): then `refused.busy`
#
# and prints, per phase: legit success rate, p50/p90/p99, the flood's Hellos/s and
# what the sidecar did with them (closed unanswered / answered), check's inbound Envoy
# refusal counters by reason (deltas), and its memory (server.memory_allocated, RSS)
# before and after. Everything on 127.0.0.0/8; every process stopped by PID.
#
#   benchmarks/envoy/flood.sh [--seconds N] [--qps N] [--connections N] [--concurrency N]
#
# Environment: ENVOY (default .venv/bin/envoy), FORTIO (default ~/go/bin/fortio).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"
SECONDS_PER_RUN=30 QPS=1000 CONNS=16 FLOOD_CONCURRENCY=64
while (($#)); do
    case $1 in
        --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
        --qps) QPS=$2; shift 2 ;;
        --connections) CONNS=$2; shift 2 ;;
        --concurrency) FLOOD_CONCURRENCY=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
FORTIO=${FORTIO:-$HOME/go/bin/fortio}
export ENVOY=${ENVOY:-$ROOT/.venv/bin/envoy}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
DIR=$(mktemp -d /tmp/themis-flood.XXXXXX)
export THEMIS_BENCH_DIR=$DIR/pair APP_ADDR=127.0.0.12:8080 APP_GRPC_ADDR=127.0.0.12:8079
B_ADMIN=127.0.0.1:15302
FLOOD=$TARGET/release/hello_flood
APP_PID=

cleanup() {
    benchmarks/envoy/themis-pair.sh stop || true
    if [[ -n $APP_PID ]]; then kill "$APP_PID" 2> /dev/null || true; wait "$APP_PID" 2> /dev/null || true; fi
}
trap cleanup EXIT

echo "building (release): agent, filter, hello_flood" >&2
benchmarks/envoy/themis-pair.sh build
cargo build -q --release -p themis-benchmarks --bin hello_flood

"$FORTIO" server -http-port "$APP_ADDR" -grpc-port "$APP_GRPC_ADDR" -redirect-port disabled \
    -tcp-port disabled -udp-port disabled -ui-path '' -loglevel warning > "$DIR/app.log" 2>&1 &
APP_PID=$!
benchmarks/envoy/themis-pair.sh start > "$DIR/pair.out"
ENVOY_B_PID=$(sed -n 4p "$THEMIS_BENCH_DIR/pids")
RESPONDER=$("$TARGET/release/themis" --socket "$THEMIS_BENCH_DIR/b/agent.sock" --json resolve check \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["instances"][0]["id"])')
echo "check's id: $RESPONDER; its inbound Envoy: pid $ENVOY_B_PID, admin $B_ADMIN" >&2

stats() { curl -s -m 5 "$B_ADMIN/stats?format=json" > "$1"; }
memory() { # allocated-bytes rss-kib
    printf '%s %s\n' \
        "$(curl -s -m 5 "$B_ADMIN/stats?filter=^server\.memory_allocated$" | awk '{print $2}')" \
        "$(awk '/^VmRSS/ {print $2}' "/proc/$ENVOY_B_PID/status")"
}
legit() { # out.json
    "$FORTIO" load -quiet -qps "$QPS" -c "$CONNS" -t "${SECONDS_PER_RUN}s" -payload-size 1024 \
        -p 50,90,99 -H "Host: check" -json "$1" "http://127.0.0.11:15001/echo" > /dev/null 2>&1
}

# Warm-up: the pair's pools and the agents' caches.
"$FORTIO" load -quiet -qps 200 -c "$CONNS" -t 3s -H "Host: check" "http://127.0.0.11:15001/echo" > /dev/null 2>&1

for phase in baseline one-src many-src; do
    echo "phase $phase: legit ${QPS} req/s, $CONNS connections, ${SECONDS_PER_RUN}s" >&2
    memory > "$DIR/$phase.mem-before"
    stats "$DIR/$phase.stats-before.json"
    flood_pid=
    case $phase in
        one-src) sources=1 ;;
        many-src) sources=64 ;;
        *) sources=0 ;;
    esac
    if ((sources > 0)); then
        "$FLOOD" --target 127.0.0.12:15006 --responder "$RESPONDER" --mode mixed \
            --seconds "$SECONDS_PER_RUN" --concurrency "$FLOOD_CONCURRENCY" \
            --source 127.0.0.50 --sources "$sources" > "$DIR/$phase.flood.json" &
        flood_pid=$!
    fi
    legit "$DIR/$phase.fortio.json"
    if [[ -n $flood_pid ]]; then wait "$flood_pid"; else echo '{}' > "$DIR/$phase.flood.json"; fi
    sleep 1
    stats "$DIR/$phase.stats-after.json"
    memory > "$DIR/$phase.mem-after"
done

python3 - "$DIR" <<'EOF'
import json, sys
d = sys.argv[1]
def stats(path):
    out = {}
    for s in json.load(open(path)).get("stats", []):
        if "name" in s and "value" in s and isinstance(s["value"], int):
            out[s["name"]] = s["value"]
    return out
print("| phase | legit ok | p50 ms | p90 ms | p99 ms | flood Hellos/s | flood closed unanswered | flood answered | refused by reason (check's inbound Envoy) | memory_allocated MiB before→after | RSS MiB before→after |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for phase in ["baseline", "one-src", "many-src"]:
    f = json.load(open(f"{d}/{phase}.fortio.json"))
    codes = f.get("RetCodes", {})
    total = sum(codes.values())
    ok = codes.get("200", 0)
    pct = {p["Percentile"]: p["Value"] * 1000 for p in f["DurationHistogram"]["Percentiles"]}
    flood = json.load(open(f"{d}/{phase}.flood.json"))
    before, after = stats(f"{d}/{phase}.stats-before.json"), stats(f"{d}/{phase}.stats-after.json")
    prefix = "wasmcustom.themis.inbound."
    refused = {k[len(prefix) + len("refused."):]: after[k] - before.get(k, 0)
               for k in after if k.startswith(prefix + "refused.") and after[k] - before.get(k, 0)}
    extra = {k[len(prefix):]: after[k] - before.get(k, 0)
             for k in after if k in (prefix + "replay_cache_evicted", prefix + "established",
                                     prefix + "known_good_handshakes")
             and after[k] - before.get(k, 0)}
    mb = [l.split() for l in (open(f"{d}/{phase}.mem-before").read(), open(f"{d}/{phase}.mem-after").read())]
    mib = lambda b: f"{int(b) / 2**20:.1f}"
    print(f"| {phase} | {ok}/{total} ({100 * ok / max(total, 1):.2f}%) | {pct.get(50, 0):.2f} | {pct.get(90, 0):.2f} | {pct.get(99, 0):.2f} "
          f"| {flood.get('hellos_per_sec', '-')} | {flood.get('closed_unanswered', '-')} | {flood.get('answered', '-')} "
          f"| {', '.join(f'{k} {v}' for k, v in sorted(refused.items())) or '-'}{'; ' + ', '.join(f'{k} {v}' for k, v in extra.items()) if extra else ''} "
          f"| {mib(mb[0][0])}→{mib(mb[1][0])} | {int(mb[0][1]) / 1024:.1f}→{int(mb[1][1]) / 1024:.1f} |")
EOF
echo "raw results: $DIR" >&2
