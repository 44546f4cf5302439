#!/usr/bin/env bash
# eBPF capture vs iptables REDIRECT, and the sk_msg fast path vs loopback TCP, side by
# side in one run. See `benchmarks/ebpf/run.sh --help`.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CMDLINE=$0
for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then CMDLINE+=" $arg"; else CMDLINE+=" $(printf '%q' "$arg")"; fi
done

usage() {
    cat <<'EOF'
Usage: benchmarks/ebpf/run.sh [options]        (as root)

Part A, capture. In a network namespace of its own (lo up, the "service" VIP 10.96.0.10
on lo, a fortio server listening on 10.96.0.10:8080, Envoy), a Fortio client in a pod
cgroup calls http://10.96.0.10:8080/ in each of these modes (iptables mode in a second,
identical namespace, so that conntrack, which its nat rules switch on, never touches the
other modes):
  direct    no capture: client -> upstream
  iptables  nat OUTPUT rules as istio-init writes them (REDIRECT --to-ports 15001, Envoy's
            uid 1337 exempt) -> Envoy 127.0.0.1:15001 (original_dst listener filter,
            ORIGINAL_DST cluster, upstream connections from 10.96.0.11) -> upstream;
            no eBPF
  ebpf      no iptables; Themis's capture (themis-capture, via capture_ctl) attached to the
            pod cgroup, Envoy's cgroup exempt, fast path off
  ebpf-fp   the same with the sk_msg fast path on (the client->Envoy hop is on loopback)
Envoy (--concurrency 2) runs as uid 1337 in the pod's proxy cgroup in every mode. For
each mode: new connections per second (fortio -keepalive=false -qps 0) at each of
--cps-connections, and latency at a fixed rate with keep-alive (-qps --qps -uniform,
--lat-connections connections). Every run is checked: all answers 200, and the path was
the mode's (Envoy's downstream_cx_total grew by the client's sockets, or not at all for
direct; the REDIRECT rule's packet count, or capture's captured/original_dst counters).
A run that fails a check is reported as FAILED and the script exits 1.

Part B, fast path. benchmarks/src/bin/fastpath_bench (ping-pong p50/p99 and one-way
throughput, 1 KiB and 64 KiB messages, every byte checked) in a cgroup with capture
attached, fast path off and on, alternating for --fp-rounds rounds. Checked: the
fast_path_sockets counter (> 0 on, 0 off) and TCP_INFO bytes received (about 0 on: the
data went socket to socket).

Progress goes to stderr; Markdown tables go to stdout at the end.

Options:
  --duration D           each measured Fortio run, Go duration (default 10s)
  --warmup D             discarded Fortio warm-up before each run (default 1s)
  --rounds N             repeat part A N times, mode order reversed every other round;
                         tables give the median (default 1)
  --modes LIST           part A modes, in order (default direct,iptables,ebpf,ebpf-fp)
  --cps-connections LIST connection counts for the conn/s runs (default 1,8,32)
  --lat-connections N    connections for the latency run (default 8)
  --qps N                request rate of the latency run (default 1000)
  --fp-rounds N          part B rounds (default 5)
  --fp-args "ARGS"       extra fastpath_bench arguments, e.g. "--iterations 20000"
  --fp-placements LIST   where part B's two processes run: "any" (the scheduler decides)
                         and/or a CPU number (both pinned to it with taskset, which takes
                         cross-CPU wake-ups out of the round trip) (default any,1)
  --skip-capture         part B only
  --skip-fastpath        part A only
  --quick                smoke test: --duration 2s --warmup 1s --cps-connections 8
                         --fp-rounds 1 --fp-args "--iterations 2000 --bytes 33554432"
  --no-build             use the binaries already built
  --no-setup             skip benchmarks/setup.sh (the tools are there)
  --keep                 keep the temporary directory (configs, logs, JSON)
  -h, --help             this help

Runs benchmarks/setup.sh first (Envoy, Fortio, iptables and the Rust toolchains;
seconds once done). Environment: ENVOY (default .venv/bin/envoy), FORTIO (default: the
Fortio that benchmarks/setup.sh installed or found), CARGO_TARGET_DIR (default target).
Needs root, a cgroup v2 mount and bpffs (mounted if missing).
Touches only: netns themis-bench-<pid> and themis-bench-<pid>-ipt, cgroups
themis-bench-<pid>/ under the cgroup v2 mount, pins /sys/fs/bpf/themis-bench-<pid>-*, and
iptables rules inside the -ipt netns; all removed on exit, also on Ctrl-C. The machine is shared and noisy: compare modes within
one run, not across runs.
EOF
}

DURATION=10s
WARMUP=1s
ROUNDS=1
MODES=direct,iptables,ebpf,ebpf-fp
CPS_CONNS=1,8,32
LAT_CONNS=8
QPS=1000
FP_ROUNDS=5
FP_ARGS=""
FP_PLACEMENTS=any,1
DO_CAPTURE=1
DO_FASTPATH=1
BUILD=1
SETUP=1
KEEP=0

while (($#)); do
    case "$1" in
        --duration) DURATION=${2:?--duration needs a value}; shift 2 ;;
        --warmup) WARMUP=${2:?--warmup needs a value}; shift 2 ;;
        --rounds) ROUNDS=${2:?--rounds needs a value}; shift 2 ;;
        --modes) MODES=${2:?--modes needs a value}; shift 2 ;;
        --cps-connections) CPS_CONNS=${2:?--cps-connections needs a value}; shift 2 ;;
        --lat-connections) LAT_CONNS=${2:?--lat-connections needs a value}; shift 2 ;;
        --qps) QPS=${2:?--qps needs a value}; shift 2 ;;
        --fp-rounds) FP_ROUNDS=${2:?--fp-rounds needs a value}; shift 2 ;;
        --fp-args) FP_ARGS=${2?--fp-args needs a value}; shift 2 ;;
        --fp-placements) FP_PLACEMENTS=${2:?--fp-placements needs a value}; shift 2 ;;
        --skip-capture) DO_CAPTURE=0; shift ;;
        --skip-fastpath) DO_FASTPATH=0; shift ;;
        --quick) DURATION=2s WARMUP=1s CPS_CONNS=8 FP_ROUNDS=1
                 FP_ARGS="--iterations 2000 --bytes 33554432"; shift ;;
        --no-build) BUILD=0; shift ;;
        --no-setup) SETUP=0; shift ;;
        --keep) KEEP=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "run.sh: unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done

for n in "$ROUNDS" "$FP_ROUNDS" "$LAT_CONNS" "$QPS"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: not a positive integer: $n" >&2; exit 2; }
done
IFS=, read -r -a MODE_LIST <<<"$MODES"
IFS=, read -r -a CPS_LIST <<<"$CPS_CONNS"
declare -A SEEN=()
for m in "${MODE_LIST[@]}"; do
    case "$m" in direct|iptables|ebpf|ebpf-fp) ;; *) echo "run.sh: unknown mode: $m" >&2; exit 2 ;; esac
    [[ -z "${SEEN[$m]:-}" ]] || { echo "run.sh: mode listed twice: $m" >&2; exit 2; }
    SEEN[$m]=1
done
for c in "${CPS_LIST[@]}"; do
    [[ "$c" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: bad connection count: $c" >&2; exit 2; }
done
IFS=, read -r -a PLACEMENT_LIST <<<"$FP_PLACEMENTS"
for p in "${PLACEMENT_LIST[@]}"; do
    [[ "$p" == any || ("$p" =~ ^[0-9]+$ && "$p" -lt "$(nproc)") ]] \
        || { echo "run.sh: bad placement: $p (any, or a CPU below $(nproc))" >&2; exit 2; }
done

# shellcheck source=SCRIPTDIR/../lib.sh
source "$HERE/../lib.sh"   # log, die, stop_pid, forget_pid, finish_tmp

# ---------------------------------------------------------------------------- checks
((EUID == 0)) || die "run as root (netns, cgroups, bpffs, iptables inside the netns)"
for tool in ip curl python3 setpriv; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done
((SETUP)) && { "$ROOT/benchmarks/setup.sh" >&2 || die "benchmarks/setup.sh failed"; }
if ((DO_CAPTURE)) && [[ ",$MODES," == *",iptables,"* ]]; then
    command -v iptables >/dev/null || die "iptables is missing: run benchmarks/setup.sh"
fi
ENVOY=${ENVOY:-$ROOT/.venv/bin/envoy}
if ((DO_CAPTURE)); then
    [[ -x "$ENVOY" ]] || die "no Envoy at $ENVOY: run benchmarks/setup.sh"
    FORTIO=$(fortio_find) || die "no Fortio $FORTIO_VERSION: run benchmarks/setup.sh"
fi
CG2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
[[ -n "$CG2" ]] || die "no cgroup v2 mount"
if ! mountpoint -q /sys/fs/bpf; then
    log "mounting bpffs on /sys/fs/bpf"
    mount -t bpf bpf /sys/fs/bpf || die "cannot mount bpffs on /sys/fs/bpf"
fi

TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[[ "$TARGET_DIR" == /* ]] || TARGET_DIR=$ROOT/$TARGET_DIR
if ((BUILD)); then
    log "building capture_ctl and fastpath_bench (release, $TARGET_DIR)"
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR nice cargo build --release -q -p themis-benchmarks \
        --bin capture_ctl --bin fastpath_bench) >&2 || die "cargo build failed"
fi
CAPTURE_CTL=$TARGET_DIR/release/capture_ctl
FASTPATH_BENCH=$TARGET_DIR/release/fastpath_bench
[[ -x "$CAPTURE_CTL" && -x "$FASTPATH_BENCH" ]] || die "binaries missing in $TARGET_DIR/release (drop --no-build)"

# ---------------------------------------------------------------------------- state
ID=$$
# Two identical namespaces: iptables mode runs in its own, so that the other modes never
# pay for conntrack (which the nat table switches on for good) nor meet its entries.
NS_MAIN=themis-bench-$ID
NS_IPT=themis-bench-$ID-ipt
NS=$NS_MAIN          # the namespace nsx works in
CGROOT=$CG2/themis-bench-$ID
POD=$CGROOT/pod
PINS_A=/sys/fs/bpf/themis-bench-$ID-capture
PINS_B=/sys/fs/bpf/themis-bench-$ID-fastpath
VIP=10.96.0.10      # the "service"; Envoy's upstream connections come from 10.96.0.11
URL=http://$VIP:8080/
PROXY_UID=1337
TMP=$(mktemp -d "${TMPDIR:-/tmp}/themis-ebpf-bench.XXXXXX")
chmod 755 "$TMP"    # Envoy (uid 1337) reads its config here
mkdir -p "$TMP/results" "$TMP/logs" "$TMP/envoy"
chown "$PROXY_UID:$PROXY_UID" "$TMP/envoy"
PIDS=()
declare -A PID_NAME=()
NETNS_MADE=()
declare -A ENVOY_ADMIN=()
IPT_ON=0



nsx() { ip netns exec "$NS" "$@"; }

ipt_rules() {   # ipt_rules -A|-D: istio-init's outbound rules, inside our netns only
    local op=$1
    if [[ "$op" == -A ]]; then
        NS=$NS_IPT
        IPT_ON=1
        nsx iptables -w -t nat -N ISTIO_REDIRECT
        nsx iptables -w -t nat -A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
        nsx iptables -w -t nat -N ISTIO_OUTPUT
        nsx iptables -w -t nat -A ISTIO_OUTPUT -m owner --uid-owner "$PROXY_UID" -j RETURN
        nsx iptables -w -t nat -A ISTIO_OUTPUT -m owner --gid-owner "$PROXY_UID" -j RETURN
        nsx iptables -w -t nat -A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
        nsx iptables -w -t nat -A ISTIO_OUTPUT -j ISTIO_REDIRECT
        nsx iptables -w -t nat -A OUTPUT -p tcp -j ISTIO_OUTPUT
    else
        IPT_ON=0
        NS=$NS_IPT
        nsx iptables -w -t nat -D OUTPUT -p tcp -j ISTIO_OUTPUT 2>/dev/null || true
        local chain
        for chain in ISTIO_OUTPUT ISTIO_REDIRECT; do
            nsx iptables -w -t nat -F "$chain" 2>/dev/null || true
            nsx iptables -w -t nat -X "$chain" 2>/dev/null || true
        done
    fi
}

cleanup() {
    local rc=$? pid d
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    ((IPT_ON)) && ipt_rules -D
    for d in "${NETNS_MADE[@]}"; do
        ip netns del "$d" 2>/dev/null || log "  could not delete netns $d"
    done
    rm -rf "$PINS_A" "$PINS_B"
    if [[ -d "$CGROOT" ]]; then
        for d in "$POD/app" "$POD/proxy" "$POD" "$CGROOT/upstream" "$CGROOT/fastpath" "$CGROOT"; do
            [[ -d "$d" ]] && { rmdir "$d" 2>/dev/null || log "  could not remove cgroup $d: $(cat "$d/cgroup.procs" 2>/dev/null | tr '\n' ' ')"; }
        done
    fi
    finish_tmp "$rc"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

LAST_PID=
# start_bg NAME LOG CGROUP CMD...: CMD in CGROUP, in the background (exec'd, so the pid
# is CMD's own).
start_bg() {
    local name=$1 logf=$2 cg=$3; shift 3
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@" >"$logf" 2>&1 &
    LAST_PID=$!
    PIDS+=("$LAST_PID")
    PID_NAME[$LAST_PID]=$name
}

# run_fg NAME LOG CGROUP CMD...: the same, waited for; returns its exit code.
run_fg() {
    local rc=0 pid
    start_bg "$@"
    pid=$LAST_PID
    wait "$pid" || rc=$?
    forget_pid "$pid"
    return "$rc"
}

dump_log() {
    printf -- '----- %s, last 30 lines -----\n' "$1" >&2
    tail -n 30 "$1" >&2 2>/dev/null || true
}

# ---------------------------------------------------------------------------- set-up
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
STARTED_AT=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
log "netns $NS_MAIN and $NS_IPT, cgroups $CGROOT, pins $PINS_A / $PINS_B, files $TMP"
mkdir -p "$POD/app" "$POD/proxy" "$CGROOT/upstream" "$CGROOT/fastpath"

make_netns() {   # make_netns NAME: lo up, the VIP and Envoy's source address on lo
    ip netns add "$1"
    NETNS_MADE+=("$1")
    NS=$1
    nsx ip link set lo up
    nsx ip addr add "$VIP/32" dev lo
    nsx ip addr add 10.96.0.11/32 dev lo
    # Many short connections: reuse TIME_WAIT ports and widen the range (this netns only).
    nsx sysctl -q -w net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="10000 65000"
}

envoy_stats() {   # "downstream_cx_total upstream_rq_total upstream_cx_total" (listener, cluster)
    nsx curl -s -m 3 "http://${ENVOY_ADMIN[$NS]}/stats?filter=^(listener\\.127\\.0\\.0\\.1_15001\\.downstream_cx_total|cluster\\.original_dst\\.upstream_(rq|cx)_total)\$" |
        awk -F': ' '/downstream_cx_total/ { cx = $2 } /upstream_rq_total/ { rq = $2 } /upstream_cx_total/ { ucx = $2 }
                    END { print cx + 0, rq + 0, ucx + 0 }'
}

redirect_packets() {   # packets the REDIRECT rule has matched (0 when absent)
    NS=$NS_IPT
    nsx iptables -w -t nat -nvxL ISTIO_REDIRECT 2>/dev/null | awk '/REDIRECT/ { n += $1 } END { print n + 0 }'
}

# start_stack NETNS: the upstream (fortio server on VIP:8080) and Envoy (uid 1337, pod/proxy).
start_stack() {
    local ns=$1 i upstream envoy admin_file=$TMP/envoy/admin-$1
    NS=$ns
    log "starting the upstream (fortio server on $VIP:8080) and Envoy (uid $PROXY_UID, cgroup pod/proxy) in $ns"
    start_bg "upstream fortio server ($ns)" "$TMP/logs/upstream-$ns.log" "$CGROOT/upstream" \
        ip netns exec "$ns" "$FORTIO" server -http-port "$VIP:8080" -grpc-port disabled \
        -redirect-port disabled -tcp-port disabled -udp-port disabled -ui-path '' -loglevel warning
    upstream=$LAST_PID
    start_bg "envoy ($ns)" "$TMP/logs/envoy-$ns.log" "$POD/proxy" \
        ip netns exec "$ns" setpriv --reuid="$PROXY_UID" --regid="$PROXY_UID" --clear-groups \
        "$ENVOY" -c "$TMP/envoy-outbound.yaml" --concurrency 2 --disable-hot-restart -l warn \
        --admin-address-path "$admin_file"
    envoy=$LAST_PID
    for ((i = 0; i < 150; i++)); do
        kill -0 "$envoy" 2>/dev/null || { dump_log "$TMP/logs/envoy-$ns.log"; die "Envoy exited during start-up"; }
        if [[ -s "$admin_file" ]]; then
            ENVOY_ADMIN[$ns]=$(<"$admin_file")
            [[ "$(nsx curl -s -m 1 "http://${ENVOY_ADMIN[$ns]}/ready" 2>/dev/null)" == LIVE* ]] && break
        fi
        sleep 0.1
    done
    ((i < 150)) || { dump_log "$TMP/logs/envoy-$ns.log"; die "Envoy not ready after 15 s"; }
    for ((i = 0; i < 50; i++)); do
        nsx curl -fsS -m 1 -o /dev/null "$URL" 2>/dev/null && break
        sleep 0.1
    done
    ((i < 50)) || { dump_log "$TMP/logs/upstream-$ns.log"; die "the upstream does not answer on $URL"; }
    kill -0 "$upstream" 2>/dev/null || die "the upstream fortio server in $ns exited"
    log "  ready: Envoy pid $envoy (admin ${ENVOY_ADMIN[$ns]}), upstream pid $upstream"
}

make_netns "$NS_MAIN"
if ((DO_CAPTURE)); then
    cp "$HERE/envoy-outbound.yaml" "$TMP/envoy-outbound.yaml"
    chmod 644 "$TMP/envoy-outbound.yaml"
    start_stack "$NS_MAIN"
    if [[ ",$MODES," == *",iptables,"* ]]; then
        make_netns "$NS_IPT"
        start_stack "$NS_IPT"
    fi
fi

# ---------------------------------------------------------------------------- modes
mode_on() {
    case "$1" in
        direct) ;;
        iptables) ipt_rules -A ;;
        ebpf|ebpf-fp)
            local fp=(); [[ "$1" == ebpf-fp ]] && fp=(--fast-path)
            timeout 60 "$CAPTURE_CTL" attach --pins "$PINS_A" --cgroup "$POD" \
                --proxy-cgroup "$POD/proxy" --outbound 127.0.0.1:15001 "${fp[@]}" \
                >"$TMP/logs/attach.json" 2>"$TMP/logs/attach.err" \
                || { cat "$TMP/logs/attach.err" >&2; die "capture_ctl attach failed"; }
            ;;
    esac
}

mode_off() {   # mode_off MODE COUNTERS_JSON
    case "$1" in
        direct) echo '{}' >"$2" ;;
        iptables)
            python3 -c 'import json,sys; print(json.dumps({"redirect_packets": int(sys.argv[1])}))' \
                "$(redirect_packets)" >"$2"
            ipt_rules -D
            ;;
        ebpf|ebpf-fp)
            timeout 60 "$CAPTURE_CTL" detach --pins "$PINS_A" >"$2" 2>"$TMP/logs/detach.err" \
                || { cat "$TMP/logs/detach.err" >&2; die "capture_ctl detach failed"; }
            rm -rf "$PINS_A"
            ;;
    esac
}

# fortio_run JSON QPS CONNS DURATION EXTRA...: the client in the pod's app cgroup.
fortio_run() {
    local json=$1 qps=$2 c=$3 dur=$4; shift 4
    # -r 0.0001: 0.1 ms histogram buckets below 1.2 ms (Fortio's default is 1 ms).
    local args=(load -quiet -qps "$qps" -c "$c" -t "$dur" -p 50,90,99 -r 0.0001 "$@")
    [[ -n "$json" ]] && args+=(-json "$json")
    run_fg "fortio load" "$TMP/logs/fortio-load.log" "$POD/app" \
        ip netns exec "$NS" "$FORTIO" "${args[@]}" "$URL" \
        || { dump_log "$TMP/logs/fortio-load.log"; envoy_errors; die "fortio load failed: ${args[*]} $URL"; }
}

envoy_errors() {   # Envoy's non-zero error counters, on stderr
    [[ -n "${ENVOY_ADMIN[$NS]:-}" ]] || return 0
    printf -- '----- Envoy: non-zero error counters -----\n' >&2
    nsx curl -s -m 3 "http://${ENVOY_ADMIN[$NS]}/stats" 2>/dev/null |
        grep -E '(rq_5xx|cx_connect_fail|protocol_error|reset|fail|error|timeout|overflow|none_healthy|no_route|cx_destroy)' |
        grep -vE ': 0$' >&2 || true
}

# measure ROUND TEST MODE: one checked run; TEST is cpsN (keep-alive off, -qps 0, N
# connections) or lat (keep-alive, -qps QPS -uniform, LAT_CONNS connections).
measure() {
    local round=$1 test=$2 mode=$3 base before after qps c extra=()
    base=$TMP/results/r$round-$test-$mode
    if [[ "$test" == lat ]]; then
        qps=$QPS c=$LAT_CONNS extra=(-uniform)
    else
        qps=0 c=${test#cps} extra=(-keepalive=false)
    fi
    mode_on "$mode"
    NS=$NS_MAIN; [[ "$mode" == iptables ]] && NS=$NS_IPT
    fortio_run "" "$qps" "$c" "$WARMUP" "${extra[@]}"
    before=$(envoy_stats)
    fortio_run "$base.json" "$qps" "$c" "$DURATION" "${extra[@]}"
    after=$(envoy_stats)
    NS=$NS_MAIN
    mode_off "$mode" "$base.counters.json"
    python3 "$HERE/report.py" check "$base" "$mode" "$before" "$after" >>"$TMP/results/checks.tsv" \
        || die "report.py check failed"
    log "    $(tail -n1 "$TMP/results/checks.tsv" | cut -f2-)"
}

if ((DO_CAPTURE)); then
    TESTS=()
    for c in "${CPS_LIST[@]}"; do TESTS+=("cps$c"); done
    TESTS+=(lat)
    for ((round = 1; round <= ROUNDS; round++)); do
        order=("${MODE_LIST[@]}")
        if ((round % 2 == 0)); then
            order=(); for ((k = ${#MODE_LIST[@]} - 1; k >= 0; k--)); do order+=("${MODE_LIST[k]}"); done
        fi
        for test in "${TESTS[@]}"; do
            for mode in "${order[@]}"; do
                log "part A, round $round/$ROUNDS, $test, $mode"
                measure "$round" "$test" "$mode"
            done
        done
    done
fi

# ---------------------------------------------------------------------------- part B
if ((DO_FASTPATH)); then
    read -r -a fp_extra <<<"$FP_ARGS"
    for place in "${PLACEMENT_LIST[@]}"; do
        pin=(); [[ "$place" != any ]] && pin=(taskset -c "$place")
        tag=any; [[ "$place" != any ]] && tag=cpu$place
        for ((round = 1; round <= FP_ROUNDS; round++)); do
            for fp in off on; do
                log "part B, processes on $tag, round $round/$FP_ROUNDS, fast path $fp"
                flag=(); [[ "$fp" == on ]] && flag=(--fast-path)
                timeout 60 "$CAPTURE_CTL" attach --pins "$PINS_B" --cgroup "$CGROOT/fastpath" "${flag[@]}" \
                    >"$TMP/logs/attach-fp.json" 2>"$TMP/logs/attach-fp.err" \
                    || { cat "$TMP/logs/attach-fp.err" >&2; die "capture_ctl attach (fast path $fp) failed"; }
                base=$TMP/results/fp-$tag-r$round-$fp
                rc=0
                run_fg "fastpath_bench" "$base.jsonl" "$CGROOT/fastpath" \
                    timeout 300 ip netns exec "$NS_MAIN" "${pin[@]}" "$FASTPATH_BENCH" --label "$fp" "${fp_extra[@]}" || rc=$?
                timeout 60 "$CAPTURE_CTL" detach --pins "$PINS_B" >"$base.counters.json" 2>"$TMP/logs/detach-fp.err" \
                    || { cat "$TMP/logs/detach-fp.err" >&2; die "capture_ctl detach (fast path $fp) failed"; }
                rm -rf "$PINS_B"
                ((rc == 0)) || { dump_log "$base.jsonl"; die "fastpath_bench failed (exit $rc), fast path $fp"; }
                python3 "$HERE/report.py" check-fp "$base" "$fp" >>"$TMP/results/checks.tsv" || die "report.py check-fp failed"
                log "    $(tail -n1 "$TMP/results/checks.tsv" | cut -f2-)"
            done
        done
    done
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------------- report
cat >"$TMP/results/meta.json" <<EOF
{"command": $(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$CMDLINE"),
 "started": "$STARTED_AT", "cores": $(nproc), "kernel": "$(uname -r)",
 "load_before": "$LOAD_BEFORE", "load_after": "$LOAD_AFTER",
 "envoy": "$( ((DO_CAPTURE)) && "$ENVOY" --version 2>/dev/null | sed -n 's/.*version: *//p' | head -n1 | cut -d/ -f2,4)",
 "fortio": "$( ((DO_CAPTURE)) && "$FORTIO" version 2>/dev/null)",
 "duration": "$DURATION", "warmup": "$WARMUP", "qps": $QPS, "lat_connections": $LAT_CONNS,
 "rounds": $ROUNDS, "fp_rounds": $FP_ROUNDS, "fp_args": "$FP_ARGS"}
EOF
python3 "$HERE/report.py" report "$TMP/results"
