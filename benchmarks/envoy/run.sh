#!/usr/bin/env bash
# Side-by-side latency/throughput of Envoy pairs, measured with Fortio, on loopback only.
# See `benchmarks/envoy/run.sh --help` and benchmarks/envoy/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CMDLINE=$0
for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then CMDLINE+=" $arg"; else CMDLINE+=" $(printf '%q' "$arg")"; fi
done

usage() {
    cat <<'EOF'
Usage: benchmarks/envoy/run.sh [options]

Runs, back to back in one invocation, Fortio against:
  direct     fortio client -> app (fortio server, 127.0.0.12:8080)
  plaintext  client -> Envoy A 127.0.0.11:15001 -> HTTP/1.1 -> Envoy B 127.0.0.12:15006 -> app
  mtls       same, but A -> B is mutual TLS 1.3 (throwaway CA, ECDSA P-256 certs, SAN checked)
  mtls2      the mtls pair again, as a scenario of its own: mtls against itself in one run
             is the machine's noise band
  themis     a Themis pair started by benchmarks/envoy/themis-pair.sh (skipped if absent),
             sealed by the Wasm filter
  themis-native  the same pair sealed by the native module (libthemis_native.so)
  themis-tls the same pair on Envoy's own TLS 1.3, the native module as its certificate
             validator (docs/PROTOCOL.md §8), certificates from the agents' SDS

For each scenario, body size (1 KB, 64 KB), pacing (Fortio's default and -uniform) and
connection count (16 and 64), over HTTP/1.1 and gRPC: a latency run at 1000 requests/s (p50/p90/p99) and a
max-throughput run (-qps 0), each after a discarded warm-up, with the pair's Envoy CPU
seconds per 10,000 requests of the max run. Requests are HTTP/1.1 POSTs of a random
payload to /echo, or gRPC pings (`fortio load -grpc -ping`, HTTP/2) of that payload to
the fortio server's gRPC port. Rounds interleave the scenarios. Everything listens on 127.0.0.0/8.

Progress goes to stderr; Markdown tables (medians over rounds) go to stdout at the end;
every run is also one JSON object in the summary file (--summary).

Options:
  --duration D       length of each measured run, Go duration syntax (default 10s)
  --quick            smoke test: --duration 3s
  --rounds N         repeat the whole set of scenarios N times, reporting each round and,
                     for N > 1, the median over rounds (default 1)
  --warmup D         length of the discarded warm-up before every measured run (default 2s)
  --scenarios LIST   comma-separated subset, in the order to run
                     (default direct,plaintext,mtls,themis,themis-native,themis-tls;
                     themis is the Wasm filter, themis-native the Envoy dynamic module
                     on the paper's channel, themis-tls the module as TLS's validator)
  --connections LIST comma-separated connection counts (default 16,64)
  --protocols LIST   comma-separated: http1, grpc (default both)
  --body-sizes LIST  comma-separated request body sizes in bytes (default 1024,65536)
  --pacing LIST      comma-separated: default (Fortio's lockstep bursts), uniform
                     (-uniform); default both
  --summary FILE     machine-readable results (default benchmarks/envoy/summary.json)
  --fortio-arg ARG   extra argument for every `fortio load` (repeatable), e.g.
                     --fortio-arg -uniform
  --perf DIR         profile the pair's Envoys (perf record -g) during every max run and
                     write DIR/<round>-<scenario>-<protocol>-b<size>-<pacing>-c<n>.txt:
                     CPU by shared object and by symbol (the stock Envoy is stripped:
                     its own code shows as one object; the module's functions by
                     name). The profiled runs' figures include perf's overhead: take
                     throughput from a run without --perf
  --one-request-per-connection
                     every pair's A->B cluster takes one request per upstream connection
                     (max_requests_per_connection: 1) and resumes no TLS session (both
                     sides, as the Themis TLS pair always is): every request is a new
                     connection and a full handshake, so max qps is new connections/s
  --keep             keep the temporary directory (configs, certs, logs, Fortio JSON)
  --no-setup         skip benchmarks/setup.sh (the tools are there)
  -h, --help         this help

Runs benchmarks/setup.sh first (Envoy, Fortio and what they need; seconds once done).

Environment: ENVOY (default .venv/bin/envoy), FORTIO (default: the Fortio that
benchmarks/setup.sh installed or found).

The machine is shared and noisy: compare scenarios within one run, not across runs.
EOF
}

DURATION=10s
WARMUP=2s
ROUNDS=1
SCENARIOS=direct,plaintext,mtls,themis,themis-native,themis-tls
CONNECTIONS=16,64
FORTIO_EXTRA=()
BODY_SIZES=1024,65536
PROTOCOLS=http1,grpc
APP_GRPC_ADDR=127.0.0.12:8079
PACINGS=default,uniform
SUMMARY=$ROOT/benchmarks/envoy/summary.json
KEEP=0
ONE_PER_CONNECTION=0
PERF_DIR=
SETUP=1
QPS=1000
PAYLOAD_SIZE=1024
APP_ADDR=127.0.0.12:8080
PAIR_ADDR=127.0.0.11:15001

while (($#)); do
    case "$1" in
        --duration) DURATION=${2:?--duration needs a value}; shift 2 ;;
        --duration=*) DURATION=${1#*=}; shift ;;
        --quick) DURATION=3s; shift ;;
        --rounds) ROUNDS=${2:?--rounds needs a value}; shift 2 ;;
        --rounds=*) ROUNDS=${1#*=}; shift ;;
        --warmup) WARMUP=${2:?--warmup needs a value}; shift 2 ;;
        --warmup=*) WARMUP=${1#*=}; shift ;;
        --scenarios) SCENARIOS=${2:?--scenarios needs a value}; shift 2 ;;
        --scenarios=*) SCENARIOS=${1#*=}; shift ;;
        --connections) CONNECTIONS=${2:?--connections needs a value}; shift 2 ;;
        --connections=*) CONNECTIONS=${1#*=}; shift ;;
        --protocols) PROTOCOLS=${2:?--protocols needs a value}; shift 2 ;;
        --protocols=*) PROTOCOLS=${1#*=}; shift ;;
        --body-sizes) BODY_SIZES=${2:?--body-sizes needs a value}; shift 2 ;;
        --body-sizes=*) BODY_SIZES=${1#*=}; shift ;;
        --pacing) PACINGS=${2:?--pacing needs a value}; shift 2 ;;
        --pacing=*) PACINGS=${1#*=}; shift ;;
        --summary) SUMMARY=${2:?--summary needs a value}; shift 2 ;;
        --summary=*) SUMMARY=${1#*=}; shift ;;
        --fortio-arg) FORTIO_EXTRA+=("${2:?--fortio-arg needs a value}"); shift 2 ;;
        --fortio-arg=*) FORTIO_EXTRA+=("${1#*=}"); shift ;;
        --keep) KEEP=1; shift ;;
        --one-request-per-connection) ONE_PER_CONNECTION=1; shift ;;
        --perf) PERF_DIR=${2:?--perf needs a directory}; shift 2 ;;
        --no-setup) SETUP=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "run.sh: unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done

[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --rounds must be a positive integer" >&2; exit 2; }
IFS=, read -r -a SCENARIO_LIST <<<"$SCENARIOS"
IFS=, read -r -a CONN_LIST <<<"$CONNECTIONS"
for s in "${SCENARIO_LIST[@]}"; do
    case "$s" in direct|plaintext|mtls|mtls2|themis|themis-native|themis-tls) ;; *) echo "run.sh: unknown scenario: $s" >&2; exit 2 ;; esac
done
for c in "${CONN_LIST[@]}"; do
    [[ "$c" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: bad connection count: $c" >&2; exit 2; }
done
IFS=, read -r -a SIZE_LIST <<<"$BODY_SIZES"
IFS=, read -r -a PACING_LIST <<<"$PACINGS"
for b in "${SIZE_LIST[@]}"; do
    [[ "$b" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: bad body size: $b" >&2; exit 2; }
done
for p in "${PACING_LIST[@]}"; do
    case "$p" in default|uniform) ;; *) echo "run.sh: unknown pacing: $p" >&2; exit 2 ;; esac
done
IFS=, read -r -a PROTOCOL_LIST <<<"$PROTOCOLS"
for p in "${PROTOCOL_LIST[@]}"; do
    case "$p" in http1|grpc) ;; *) echo "run.sh: unknown protocol: $p" >&2; exit 2 ;; esac
done
PACING=default
PROTOCOL=http1

# shellcheck source=SCRIPTDIR/../lib.sh
source "$HERE/../lib.sh"   # log, die, stop_pid, forget_pid, finish_tmp

# ---------------------------------------------------------------------------- binaries
((SETUP)) && { "$ROOT/benchmarks/setup.sh" >&2 || die "benchmarks/setup.sh failed"; }
ENVOY=${ENVOY:-$ROOT/.venv/bin/envoy}
[[ -x "$ENVOY" ]] || die "no Envoy at $ENVOY: run benchmarks/setup.sh"
FORTIO=$(fortio_find) || die "no Fortio $FORTIO_VERSION: run benchmarks/setup.sh"
for tool in python3 openssl curl; do
    command -v "$tool" >/dev/null || die "$tool is missing: run benchmarks/setup.sh"
done

# The Themis pair's binaries are built before anything is timed or started (a cold
# build takes minutes, more than the start hook's time limit).
if [[ -f "$HERE/themis-pair.sh" && ",$SCENARIOS," == *",themis,"* ]]; then
    log "building the Themis pair (themis-pair.sh build)"
    REPO_ROOT=$ROOT bash "$HERE/themis-pair.sh" build >&2 || die "themis-pair.sh build failed"
fi

# ---------------------------------------------------------------------------- processes
TMP=$(mktemp -d "${TMPDIR:-/tmp}/themis-envoy-bench.XXXXXX")
mkdir -p "$TMP/results" "$TMP/logs"
if [[ -n $PERF_DIR ]]; then
    command -v perf >/dev/null || die "--perf needs perf (apt-get install linux-perf)"
    mkdir -p "$PERF_DIR" && PERF_DIR=$(cd "$PERF_DIR" && pwd)
fi
PIDS=()              # every process this script started and has not stopped yet
declare -A PID_NAME=()
THEMIS_STARTED=0
THEMIS_RUNTIME=wasm
THEMIS_SCRIPT=$HERE/themis-pair.sh



# themis_pair start|stop (stdout/stderr as redirected by the caller), with the environment
# the hook may use. Run in the background and waited for, so that INT/TERM reach our trap
# at once; bounded by `timeout`.
themis_pair() {
    local pid rc=0
    THEMIS_BENCH_DIR=$TMP/themis THEMIS_RUNTIME=$THEMIS_RUNTIME THEMIS_ONE_REQUEST_PER_CONNECTION=$ONE_PER_CONNECTION APP_ADDR=$APP_ADDR APP_GRPC_ADDR=$APP_GRPC_ADDR ENVOY=$ENVOY FORTIO=$FORTIO \
        ENVOY_CONCURRENCY=2 REPO_ROOT=$ROOT \
        timeout 180 bash "$THEMIS_SCRIPT" "$1" &
    pid=$!
    PIDS+=("$pid"); PID_NAME[$pid]="themis-pair.sh $1"
    wait "$pid" || rc=$?
    forget_pid "$pid"
    return "$rc"
}

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    if ((THEMIS_STARTED)); then
        log "stopping the themis pair (themis-pair.sh stop)"
        THEMIS_STARTED=0
        themis_pair stop >>"$TMP/logs/themis-pair.out" 2>&1 || log "  themis-pair.sh stop failed"
    fi
    finish_tmp "$rc"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

LAST_PID=
start_bg() {   # start_bg NAME LOGFILE CMD...: runs CMD in the background, sets LAST_PID
    local name=$1 logf=$2; shift 2
    "$@" >"$logf" 2>&1 &
    LAST_PID=$!
    PIDS+=("$LAST_PID")
    PID_NAME[$LAST_PID]=$name
}

dump_log() {   # dump_log NAME FILE
    printf -- '----- %s (%s), last 40 lines -----\n' "$1" "$2" >&2
    tail -n 40 "$2" >&2 2>/dev/null || true
    printf -- '----- end of %s -----\n' "$1" >&2
}

# ---------------------------------------------------------------------------- readiness
head -c "$PAYLOAD_SIZE" /dev/urandom >"$TMP/payload.bin"

# probe URL [HOST]: one POST of the payload, 2xx required.
probe() {
    local args=(-fsS -m 2 -o /dev/null -X POST --data-binary "@$TMP/payload.bin")
    [[ -n "${2:-}" ]] && args+=(-H "Host: $2")
    curl "${args[@]}" "$1" 2>"$TMP/logs/probe.err"
}

# wait_request URL HOST WHAT LOGS...: 100 x 0.1 s for one successful request.
wait_request() {
    local url=$1 host=$2 what=$3 i; shift 3
    for ((i = 0; i < 100; i++)); do
        probe "$url" "$host" && return 0
        sleep 0.1
    done
    log "$what: no successful request to $url${host:+ (Host: $host)} within 10 s: $(cat "$TMP/logs/probe.err")"
    local f; for f in "$@"; do dump_log "$(basename "$f")" "$f"; done
    return 1
}

# start_envoy NAME CONFIG BASE_ID: starts it and waits for admin /ready (100 x 0.1 s).
start_envoy() {
    local name=$1 cfg=$2 base_id=$3 pid i addr
    local logf=$TMP/logs/envoy-$name.log adminf=$TMP/envoy-$name.admin
    rm -f "$adminf"
    start_bg "envoy $name" "$logf" "$ENVOY" -c "$cfg" --concurrency 2 --disable-hot-restart \
        --base-id "$base_id" -l warn --admin-address-path "$adminf"
    pid=$LAST_PID
    for ((i = 0; i < 100; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            dump_log "envoy $name" "$logf"
            die "envoy $name exited during start-up (config $cfg)"
        fi
        if [[ -s "$adminf" ]]; then
            addr=$(<"$adminf")
            if [[ "$(curl -s -m 1 "http://$addr/ready" 2>/dev/null)" == LIVE* ]]; then
                log "  envoy $name ready (pid $pid, admin $addr)"
                return 0
            fi
        fi
        sleep 0.1
    done
    dump_log "envoy $name" "$logf"
    die "envoy $name not ready after 10 s (admin /ready)"
}

# ---------------------------------------------------------------------------- pairs
render() {   # render TEMPLATE OUT
    sed "s#@CERTS@#$TMP/certs#g" "$HERE/$1" >"$2"
    ((ONE_PER_CONNECTION)) && one_request_per_connection peer "$2"
    return 0
}

# one_request_per_connection CLUSTER_REGEX FILE: the clusters named so take one request
# per upstream connection, and no side of the file resumes a TLS session.
one_request_per_connection() {
    python3 "$HERE/one-request-per-connection.py" "$1" "$2"
}

gen_certs() {   # a throwaway CA and two Istio-style ECDSA P-256 workload certs (a, b)
    local d=$TMP/certs n
    [[ -f "$d/b.crt" ]] && return 0
    mkdir -p "$d"
    (
        cd "$d"
        openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key
        openssl req -x509 -new -key ca.key -sha256 -days 1 \
            -subj "/O=themis-bench/CN=themis-bench throwaway CA" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt
        for n in a b; do
            openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$n.key"
            openssl req -new -key "$n.key" -subj "/O=themis-bench" -out "$n.csr"
            printf '%s\n' "basicConstraints=critical,CA:FALSE" \
                "keyUsage=critical,digitalSignature,keyEncipherment" \
                "extendedKeyUsage=serverAuth,clientAuth" \
                "subjectAltName=critical,URI:spiffe://cluster.local/ns/bench/sa/$n" >"$n.ext"
            openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 8)" \
                -days 1 -sha256 -extfile "$n.ext" -out "$n.crt"
        done
    ) >"$TMP/logs/openssl.log" 2>&1 || { dump_log openssl "$TMP/logs/openssl.log"; die "certificate generation failed"; }
    chmod 600 "$d"/*.key
}

ENVOY_A_PID= ENVOY_B_PID=
start_pair() {   # start_pair plaintext|mtls
    local kind=$1 base=2101
    if [[ "$kind" == mtls ]]; then gen_certs; base=2103; fi
    render "$kind-a.yaml" "$TMP/$kind-a.yaml"
    render "$kind-b.yaml" "$TMP/$kind-b.yaml"
    # B first, so that A's first upstream connection finds it.
    start_envoy "$kind-b" "$TMP/$kind-b.yaml" $((base + 1)); ENVOY_B_PID=$LAST_PID
    start_envoy "$kind-a" "$TMP/$kind-a.yaml" "$base"; ENVOY_A_PID=$LAST_PID
    wait_request "http://$PAIR_ADDR/echo" "" "$kind" \
        "$TMP/logs/envoy-$kind-a.log" "$TMP/logs/envoy-$kind-b.log" || die "$kind pair does not pass requests"
}

# pair_stats KIND: Envoy A's view of the A->B hop (pooling; TLS version for mtls), on stderr.
pair_stats() {
    local addr stats
    addr=$(<"$TMP/envoy-$1-a.admin")
    stats=$(curl -s -m 2 "http://$addr/stats?filter=^cluster\\.peer\\.(upstream_cx_total|upstream_rq_total|ssl\\.handshake|ssl\\.versions\\..*|ssl\\.connection_error)\$" \
        | sed 's/^cluster\.peer\.//' | tr '\n' ' ' || true)
    log "  envoy $1-a, cluster peer: ${stats:-no stats}"
}

# pair_errors: the non-zero error counters of the running pair's Envoys, on stderr.
pair_errors() {
    local f
    for f in "$TMP"/envoy-*.admin; do
        [[ -s "$f" ]] || continue
        printf -- '----- %s: non-zero error counters -----\n' "$(basename "$f" .admin)" >&2
        curl -s -m 2 "http://$(<"$f")/stats" 2>/dev/null \
            | grep -E '(rq_[45]xx|rq_[45][0-9][0-9]|protocol_error|reset|fail|error|timeout|destroy_remote_with_active_rq):' \
            | grep -vE ': 0$|_time:' >&2 || true
    done
}

stop_pair() {
    stop_pid "$ENVOY_A_PID"
    stop_pid "$ENVOY_B_PID"
    ENVOY_A_PID= ENVOY_B_PID=
    rm -f "$TMP"/envoy-*.admin
}

# --- themis hook ---------------------------------------------------------------------
# NOT implemented here: benchmarks/envoy/themis-pair.sh (owned by the filter's author)
# starts the agents + Envoys with the Themis filter. Contract (see README.md):
#   themis-pair.sh start  starts everything in the background, returns once started,
#                         prints on stdout the outbound listener address (127.x.y.z:port)
#                         and the Host header, either as lines `address=...` / `host=...`
#                         or as one line `ADDRESS [HOST]` (host defaults to `check`);
#   themis-pair.sh stop   stops everything it started.
# The runner then waits for one successful request through the pair and measures with
# -H "Host: <host>". A missing script skips the scenario; a failing one marks it failed.
THEMIS_ADDR= THEMIS_HOST= THEMIS_GRPC_HOST=
start_themis() {
    mkdir -p "$TMP/themis"
    THEMIS_STARTED=1
    # stdout to a file, not $(...): background children keeping the pipe open would hang.
    if ! themis_pair start >"$TMP/logs/themis-pair.out" 2>"$TMP/logs/themis-pair.err"; then
        dump_log "themis-pair.sh start (stderr)" "$TMP/logs/themis-pair.err"
        log "themis: failed (themis-pair.sh start exited non-zero)"
        return 1
    fi
    THEMIS_ADDR=$(sed -n 's/^address=//p' "$TMP/logs/themis-pair.out" | tail -n1)
    THEMIS_HOST=$(sed -n 's/^host=//p' "$TMP/logs/themis-pair.out" | tail -n1)
    THEMIS_GRPC_HOST=$(sed -n 's/^grpc_host=//p' "$TMP/logs/themis-pair.out" | tail -n1)
    if [[ -z "$THEMIS_ADDR" ]]; then
        local line
        line=$(grep -E '^[[:space:]]*127\.[0-9.]+:[0-9]+' "$TMP/logs/themis-pair.out" | tail -n1 || true)
        read -r THEMIS_ADDR THEMIS_HOST _ <<<"$line" || true
    fi
    THEMIS_HOST=${THEMIS_HOST:-check}
    if ! [[ "$THEMIS_ADDR" =~ ^127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}:[0-9]{1,5}$ ]]; then
        dump_log "themis-pair.sh start (stdout)" "$TMP/logs/themis-pair.out"
        log "themis: failed (no loopback address 127.x.y.z:port in themis-pair.sh's output)"
        return 1
    fi
    log "  themis pair at $THEMIS_ADDR, Host: $THEMIS_HOST"
    wait_request "http://$THEMIS_ADDR/echo" "$THEMIS_HOST" themis \
        "$TMP/logs/themis-pair.err" "$TMP"/themis/*.log || { log "themis: failed (no successful request)"; return 1; }
}

stop_themis() {
    if ((THEMIS_STARTED)); then
        themis_pair stop >>"$TMP/logs/themis-pair.out" 2>>"$TMP/logs/themis-pair.err" \
            || log "  themis-pair.sh stop exited non-zero"
        THEMIS_STARTED=0
    fi
}

# ---------------------------------------------------------------------------- fortio
# fortio_load OUT_JSON QPS CONNS DURATION URL [HOST]  (OUT_JSON empty = warm-up, discarded)
fortio_load() {
    local json=$1 qps=$2 c=$3 dur=$4 url=$5 host=${6:-} rc=0 pid
    local args=(load -quiet -qps "$qps" -c "$c" -t "$dur" -payload-size "$PAYLOAD_SIZE"
        -p 50,90,99,99.9 "${FORTIO_EXTRA[@]}")
    [[ "$PACING" == uniform ]] && args+=(-uniform)
    [[ "$PROTOCOL" == grpc ]] && args+=(-grpc -ping)
    [[ -n "$host" ]] && args+=(-H "Host: $host")
    [[ -n "$json" ]] && args+=(-json "$json")
    : >"$TMP/logs/fortio-load.log"
    start_bg "fortio load" "$TMP/logs/fortio-load.log" "$FORTIO" "${args[@]}" "$url"
    pid=$LAST_PID
    wait "$pid" || rc=$?
    forget_pid "$pid"
    if ((rc != 0)); then
        dump_log "fortio load" "$TMP/logs/fortio-load.log"
        pair_errors
        die "fortio load exited with $rc: $FORTIO ${args[*]} $url"
    fi
}

# profile_start NAME PID...: with --perf, samples the processes' stacks for the run's
# duration in the background; profile_end waits and writes NAME.txt.
PROFILE_PID= PROFILE_NAME=
profile_start() {
    [[ -n $PERF_DIR && $# -gt 1 ]] || return 0
    PROFILE_NAME=$1; shift
    local ids
    ids=$(IFS=,; echo "$*")
    perf record -q -F 499 -g -p "$ids" -o "$PERF_DIR/$PROFILE_NAME.data" -- sleep "$DURATION" \
        >"$PERF_DIR/$PROFILE_NAME.log" 2>&1 &
    PROFILE_PID=$!
}
profile_end() {
    [[ -n $PROFILE_PID ]] || return 0
    wait "$PROFILE_PID" || log "  perf record exited non-zero (see $PERF_DIR/$PROFILE_NAME.log)"
    PROFILE_PID=
    {
        echo "# CPU of the pair's Envoys by shared object, then by symbol (perf, 499 Hz)"
        perf report -i "$PERF_DIR/$PROFILE_NAME.data" --no-children --sort dso --stdio -g none \
            --percent-limit 0.5 2>/dev/null | sed -n '/^ /p'
        echo
        perf report -i "$PERF_DIR/$PROFILE_NAME.data" --no-children --sort dso,sym --stdio -g none \
            --percent-limit 0.7 2>/dev/null | sed -n '/^ /p'
    } >"$PERF_DIR/$PROFILE_NAME.txt" || log "  perf report failed"
    rm -f "$PERF_DIR/$PROFILE_NAME.data"
    log "    profile: $PERF_DIR/$PROFILE_NAME.txt"
}

# cpu_ticks PID...: user+system CPU time of the processes, in clock ticks.
cpu_ticks() {
    local pid total=0
    for pid in "$@"; do
        [[ -r /proc/$pid/stat ]] || continue
        # utime and stime: fields 14 and 15, i.e. 12 and 13 after the ")" ending the name.
        total=$((total + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')))
    done
    echo "$total"
}

# measure ROUND SCENARIO HTTP_URL HTTP_HOST GRPC_TARGET GRPC_HOST "HTTP_PIDS" "GRPC_PIDS":
# every protocol, body size, pacing and connection count; the runs are listed in
# $TMP/results/index (one line each). The CPU of a max run is that of the Envoys that
# carry its protocol (space-separated pids; none for direct), and no other.
measure() {
    local round=$1 scen=$2 http_url=$3 http_host=$4 grpc_target=$5 grpc_host=$6 c base before after url host
    local -a http_pids grpc_pids pids
    read -r -a http_pids <<< "${7:-}"
    read -r -a grpc_pids <<< "${8:-}"
    for PROTOCOL in "${PROTOCOL_LIST[@]}"; do
    if [[ $PROTOCOL == grpc ]]; then
        url=$grpc_target host=$grpc_host pids=("${grpc_pids[@]}")
    else
        url=$http_url host=$http_host pids=("${http_pids[@]}")
    fi
    for PAYLOAD_SIZE in "${SIZE_LIST[@]}"; do
        for PACING in "${PACING_LIST[@]}"; do
            for c in "${CONN_LIST[@]}"; do
                base=$TMP/results/r$round-$scen-$PROTOCOL-b$PAYLOAD_SIZE-$PACING-c$c
                log "  $scen $PROTOCOL ${PAYLOAD_SIZE} B, $PACING pacing, c=$c: latency at $QPS qps for $DURATION"
                fortio_load "" "$QPS" "$c" "$WARMUP" "$url" "$host"
                fortio_load "$base-lat.json" "$QPS" "$c" "$DURATION" "$url" "$host"
                log "    $(summary_line "$base-lat.json")"
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t\t%s\n' "$base-lat.json" "$round" "$scen" "$c" \
                    "$PAYLOAD_SIZE" "$PACING" latency "$PROTOCOL" >>"$TMP/results/index"
                fortio_load "" 0 "$c" "$WARMUP" "$url" "$host"
                before=$(cpu_ticks "${pids[@]}")
                profile_start "${base##*/}" "${pids[@]}"
                fortio_load "$base-max.json" 0 "$c" "$DURATION" "$url" "$host"
                after=$(cpu_ticks "${pids[@]}")
                profile_end
                log "    max: $(summary_line "$base-max.json")"
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$base-max.json" "$round" "$scen" "$c" \
                    "$PAYLOAD_SIZE" "$PACING" max "$((${#pids[@]} ? after - before : 0))" "$PROTOCOL" >>"$TMP/results/index"
            done
        done
    done
    done
}

summary_line() {
    python3 - "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
p = {x["Percentile"]: x["Value"] * 1e3 for x in d["DurationHistogram"]["Percentiles"]}
codes = d.get("RetCodes") or {}
# HTTP: 2xx; gRPC ping: SERVING.
bad = sum(v for k, v in codes.items() if not (str(k).startswith("2") or k == "SERVING"))
print("%.1f qps, p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, %d non-2xx/errors, %d sockets for %d connections"
      % (d["ActualQPS"], p.get(50, 0), p.get(90, 0), p.get(99, 0), bad, d.get("SocketCount", 0), d["NumThreads"]))
EOF
}

# ---------------------------------------------------------------------------- run
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
STARTED_AT=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
log "envoy: $("$ENVOY" --version 2>/dev/null | sed -n 's/.*version: *//p' | head -n1)"
log "fortio: $FORTIO $("$FORTIO" version 2>/dev/null)"
log "temporary directory: $TMP"
log "scenarios ${SCENARIO_LIST[*]}, connections ${CONN_LIST[*]}, $ROUNDS round(s), runs of $DURATION after $WARMUP warm-ups"
((ONE_PER_CONNECTION)) && log "one request per upstream connection, no TLS session resumed: max qps is new connections/s"

log "starting the app: fortio server on $APP_ADDR"
start_bg "fortio server (app)" "$TMP/logs/app.log" "$FORTIO" server -http-port "$APP_ADDR" \
    -grpc-port "$APP_GRPC_ADDR" -redirect-port disabled -tcp-port disabled -udp-port disabled \
    -ui-path '' -loglevel warning
APP_PID=$LAST_PID
wait_request "http://$APP_ADDR/echo" "" app "$TMP/logs/app.log" || die "the app (fortio server) is not answering on $APP_ADDR"
kill -0 "$APP_PID" 2>/dev/null || { dump_log app "$TMP/logs/app.log"; die "fortio server exited (is $APP_ADDR taken?)"; }

: >"$TMP/results/status"
for ((round = 1; round <= ROUNDS; round++)); do
    for scen in "${SCENARIO_LIST[@]}"; do
        log "round $round/$ROUNDS: $scen"
        case "$scen" in
            direct)
                measure "$round" direct "http://$APP_ADDR/echo" "" "$APP_GRPC_ADDR" ""
                ;;
            plaintext|mtls|mtls2)
                kind=${scen%2}   # mtls2 is the mtls pair, measured as a scenario of its own
                start_pair "$kind"
                measure "$round" "$scen" "http://$PAIR_ADDR/echo" "" "$PAIR_ADDR" "" \
                    "$ENVOY_A_PID $ENVOY_B_PID" "$ENVOY_A_PID $ENVOY_B_PID"
                pair_stats "$kind"
                stop_pair
                ;;
            themis|themis-native|themis-tls)
                # The same pair, sealed by the Wasm filter or by the native module, or
                # on Envoy's TLS with the module as its validator.
                case $scen in
                    themis) THEMIS_RUNTIME=wasm ;;
                    themis-native) THEMIS_RUNTIME=native ;;
                    themis-tls) THEMIS_RUNTIME=tls ;;
                esac
                if [[ ! -f "$THEMIS_SCRIPT" ]]; then
                    log "$scen: skipped (benchmarks/envoy/themis-pair.sh not present)"
                    echo "$round $scen skipped (benchmarks/envoy/themis-pair.sh not present)" >>"$TMP/results/status"
                elif start_themis; then
                    # Its Envoys: the 3rd to 5th processes themis-pair.sh started: A, B for
                    # HTTP/1.1 and B for gRPC. A row counts A and the B that carries it,
                    # as the mTLS pair's counts its two (the other B is idle then).
                    mapfile -t envoys < <(sed -n '3,5p' "$TMP/themis/pids")
                    measure "$round" "$scen" "http://$THEMIS_ADDR/echo" "$THEMIS_HOST" "$THEMIS_ADDR" "$THEMIS_GRPC_HOST" \
                        "${envoys[0]} ${envoys[1]}" "${envoys[0]} ${envoys[2]}"
                    log "  themis counters: $(REPO_ROOT=$ROOT THEMIS_BENCH_DIR=$TMP/themis bash "$THEMIS_SCRIPT" stats | tr '\n' ' ')"
                    stop_themis
                else
                    stop_themis
                    echo "$round $scen failed (see the messages above)" >>"$TMP/results/status"
                fi
                ;;
        esac
    done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------------- report
CLK_TCK=$(getconf CLK_TCK)
CHART=${SUMMARY%.json}.svg
python3 - "$TMP/results" "$ROUNDS" "$SCENARIOS" "$CLK_TCK" "$SUMMARY" <<'EOF'
import collections, json, os, statistics, sys

results, rounds, scenarios, clk, summary_path = sys.argv[1:6]
rounds, clk, scenarios = int(rounds), int(clk), scenarios.split(",")
status = {}
if os.path.exists(os.path.join(results, "status")):
    for line in open(os.path.join(results, "status")):
        r, scen, msg = line.rstrip("\n").split(" ", 2)
        status[(int(r), scen)] = msg

runs = []
index = os.path.join(results, "index")
for line in open(index) if os.path.exists(index) else []:
    path, r, scen, c, size, pacing, kind, ticks, protocol = line.rstrip("\n").split("\t")
    d = json.load(open(path))
    p = {x["Percentile"]: x["Value"] * 1e3 for x in d["DurationHistogram"]["Percentiles"]}
    codes = d.get("RetCodes") or {}
    count = d["DurationHistogram"]["Count"]
    cpu = int(ticks) / clk if ticks else None
    runs.append({
        "scenario": scen, "protocol": protocol, "body_bytes": int(size), "connections": int(c),
        "pacing": pacing, "round": int(r), "kind": kind,
        "p50_ms": round(p.get(50, 0), 3), "p90_ms": round(p.get(90, 0), 3), "p99_ms": round(p.get(99, 0), 3),
        "qps": round(d["ActualQPS"], 1), "requests": count,
        "errors": sum(v for k, v in codes.items() if not (str(k).startswith("2") or k == "SERVING")),
        "envoy_cpu_s_per_10k": round(cpu / count * 10000, 3) if cpu is not None and count else None,
    })
with open(summary_path, "w") as f:
    json.dump(runs, f, indent=1)
    f.write("\n")

def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

groups = collections.defaultdict(list)
for run in runs:
    groups[(run["protocol"], run["body_bytes"], run["pacing"], run["scenario"], run["connections"], run["kind"])].append(run)

def cell(v, fmt):
    return "–" if v is None else fmt % v

for protocol, size, pacing in sorted({(r["protocol"], r["body_bytes"], r["pacing"]) for r in runs}):
    if True:
        print("### %s, %d B bodies, %s pacing (median of %d round%s)" % (
            "gRPC" if protocol == "grpc" else "HTTP/1.1", size, pacing, rounds, "s" if rounds > 1 else ""))
        print()
        print("| scenario | conns | p50 ms | p90 ms | p99 ms | max qps | max vs mtls | p90 vs mtls | Envoy CPU s / 10k req | errors |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for scen in scenarios:
            for c in sorted({r["connections"] for r in runs}):
                lat = groups.get((protocol, size, pacing, scen, c, "latency"), [])
                mx = groups.get((protocol, size, pacing, scen, c, "max"), [])
                if not lat and not mx:
                    continue
                p50, p90, p99 = (median([r[k] for r in lat]) for k in ("p50_ms", "p90_ms", "p99_ms"))
                qmax = median([r["qps"] for r in mx])
                cpu = median([r["envoy_cpu_s_per_10k"] for r in mx]) if scen != "direct" else None
                mt_max = median([r["qps"] for r in groups.get((protocol, size, pacing, "mtls", c, "max"), [])])
                mt_p90 = median([r["p90_ms"] for r in groups.get((protocol, size, pacing, "mtls", c, "latency"), [])])
                ratio = "%.2f×" % (qmax / mt_max) if qmax and mt_max and scen != "mtls" else "–"
                dp90 = "%+.3f ms" % (p90 - mt_p90) if p90 is not None and mt_p90 is not None and scen != "mtls" else "–"
                errors = sum(r["errors"] for r in lat + mx)
                print("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %d |" % (
                    scen, c, cell(p50, "%.3f"), cell(p90, "%.3f"), cell(p99, "%.3f"), cell(qmax, "%.0f"),
                    ratio, dp90, cell(cpu, "%.2f"), errors))
        print()
notes = ["- round %d, %s: %s" % (r, scen, msg) for (r, scen), msg in sorted(status.items())]
if notes:
    print("\n".join(notes))
    print()
EOF
python3 "$HERE/chart.py" "$SUMMARY" "$CHART" || log "the chart could not be drawn"

cat <<EOF
- p50/p90/p99: Fortio's latency percentiles at a fixed $QPS requests/s (\`-qps $QPS\`); "max qps": \`-qps 0\`;
  "errors": non-2xx responses and socket errors of both runs; medians over the rounds.
- "Envoy CPU s / 10k req": user+system CPU seconds of both Envoys of the pair during the max run,
  per 10,000 requests (the Themis pair's: A and the B that serves the row's protocol; its
  other B, idle then, is not counted).
- every run: HTTP/1.1 POST of a random body to /echo of a fortio server, or a gRPC ping
  carrying it (\`-grpc -ping\`) to its gRPC port, $DURATION after a discarded
  $WARMUP warm-up. Default pacing: Fortio's c connections send in lockstep (a burst of c requests
  every c/$QPS s); uniform: \`-uniform\`, requests spread evenly. Rounds interleave the scenarios.
- Envoys: \`--concurrency 2\`, keep-alive pools, log level warn; no access logs but the
  Themis TLS callee's (deploy/envoy/sidecar-tls.yaml logs each request: its cost was not
  measurable in an ablation, benchmarks/RESULTS.md);
  mtls = TLS 1.3, ECDSA P-256 certificates, client certificate required, SANs checked both ways.
- machine-readable: \`${SUMMARY#"$ROOT"/}\` (one object per run); chart: \`${CHART#"$ROOT"/}\`
  (max qps and Envoy CPU per request by scenario, drawn by benchmarks/envoy/chart.py).
- command: \`$CMDLINE\`
- versions: Envoy $("$ENVOY" --version 2>/dev/null | sed -n 's/.*version: *//p' | head -n1 | cut -d/ -f2,4,5), Fortio $("$FORTIO" version 2>/dev/null)
- started $STARTED_AT on $(nproc) cores; load average $LOAD_BEFORE before, $LOAD_AFTER after
EOF
