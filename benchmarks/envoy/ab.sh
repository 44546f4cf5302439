#!/usr/bin/env bash
# A/B of two sidecar templates on one benchmark row: the Themis pair started from
# template A, then from template B, alternated N times (one run.sh round each), so
# that the machine's drift falls on both alike. Prints each run's max qps and Envoy
# CPU per 10k requests, and the medians. For ablations: copy a template
# (deploy/envoy/sidecar-native.yaml, or sidecar-tls.yaml with --runtime tls), take a
# piece out, and compare it with the original.
#
#   benchmarks/envoy/ab.sh [--pairs N] [--runtime native|wasm|tls] A.yaml B.yaml [run.sh options]
#
# The run.sh options default to the gRPC 1 KB row: --protocols grpc --body-sizes 1024
# --connections 16 --pacing default --duration 3s --warmup 1s; any given replace them.
# Each run's report and summary are kept in a temporary directory (printed).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

PAIRS=6 RUNTIME=native
while [[ $# -gt 0 ]]; do
    case $1 in
        --pairs) PAIRS=${2:?--pairs needs a value}; shift 2 ;;
        --runtime) RUNTIME=${2:?--runtime needs a value}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) break ;;
    esac
done
[[ $# -ge 2 ]] || { usage >&2; exit 2; }
[[ "$PAIRS" =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: --pairs must be a positive integer" >&2; exit 2; }
[[ $RUNTIME =~ ^(native|wasm|tls)$ ]] || { echo "ab.sh: --runtime is native, wasm or tls" >&2; exit 2; }
A=$(realpath "$1") B=$(realpath "$2"); shift 2
for t in "$A" "$B"; do [[ -f $t ]] || { echo "ab.sh: no template $t" >&2; exit 2; }; done
ROW=(--protocols grpc --body-sizes 1024 --connections 16 --pacing default --duration 3s --warmup 1s)
[[ $# -gt 0 ]] && ROW=("$@")
case $RUNTIME in
    native) SCENARIO=themis-native ;;
    wasm) SCENARIO=themis ;;
    tls) SCENARIO=themis-tls ;;
esac
OUT=$(mktemp -d /tmp/themis-ab.XXXXXX)
echo "ab.sh: $PAIRS pairs, $SCENARIO, ${ROW[*]}; reports in $OUT" >&2

# run LABEL TEMPLATE I: one round; prints "max_qps cpu_per_10k".
run() {
    local label=$1 template=$2 i=$3 log
    log=$OUT/$label-$i.log
    THEMIS_SIDECAR_TEMPLATE=$template "$HERE/run.sh" --no-setup --rounds 1 --scenarios "$SCENARIO" \
        --summary "$OUT/$label-$i.json" "${ROW[@]}" > "$log" 2>&1 \
        || { echo "ab.sh: run.sh failed ($log):" >&2; tail -20 "$log" >&2; exit 1; }
    # The report's row: | scenario | conns | p50 | p90 | p99 | max qps | vs | p90 vs | CPU | errors |
    local row
    row=$(grep "^| $SCENARIO |" "$log" | head -1 || true)
    [[ -n $row ]] || { echo "ab.sh: no $SCENARIO row in $log (did the pair start?):" >&2; tail -20 "$log" >&2; exit 1; }
    awk -F'|' '{gsub(/ /, "", $7); gsub(/ /, "", $10); print $7, $10}' <<< "$row"
}

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

declare -a QA QB CA CB
printf '%-4s %12s %10s %12s %10s\n' pair "A max qps" "A CPU" "B max qps" "B CPU"
for i in $(seq "$PAIRS"); do
    ra=$(run A "$A" "$i")
    rb=$(run B "$B" "$i")
    read -r qa ca <<< "$ra"
    read -r qb cb <<< "$rb"
    QA+=("$qa") CA+=("$ca") QB+=("$qb") CB+=("$cb")
    printf '%-4s %12s %10s %12s %10s\n' "$i" "$qa" "$ca" "$qb" "$cb"
done
printf '%-4s %12s %10s %12s %10s\n' median \
    "$(printf '%s\n' "${QA[@]}" | median)" "$(printf '%s\n' "${CA[@]}" | median)" \
    "$(printf '%s\n' "${QB[@]}" | median)" "$(printf '%s\n' "${CB[@]}" | median)"
echo "(CPU: both Envoys' user+system seconds per 10,000 requests in the max run; A = $A, B = $B)"
