#!/usr/bin/env bash
# What a Wasm sidecar's handshake signing costs a new connection: the Themis pair
# (themis-pair.sh, Wasm runtime) with one request per sealed connection (every request
# a key agreement), its workers signing with delegated keys (the default) or kept
# keyless ("delegated_keys": false: the agent signs each message 1 and 2). Sequential
# curl requests through Envoy A, ROUNDS rounds interleaving the two; prints the median
# and p90 of each. Loopback only (127.0.0.11-12); everything started is stopped by PID.
#
#   benchmarks/envoy/handshake-signing.sh [REQUESTS] [ROUNDS]   (default 300 2)
#
# Needs `themis-pair.sh build` first, Envoy in .venv (scripts/setup.sh) and curl.
set -euo pipefail
cd "$(dirname "$0")/../.."
REQUESTS=${1:-300} ROUNDS=${2:-2}
work=$(mktemp -d /tmp/themis-signing.XXXXXX)
mkdir -p "$work/www" && echo ok > "$work/www/index.html"

# Envoy, after one edit of the pair's config: one request per sealed connection and,
# with KEYLESS=1, the keyless sidecar.
cat > "$work/envoy" <<'WRAP'
#!/usr/bin/env bash
for ((i = 1; i <= $#; i++)); do [[ ${!i} == -c ]] && { j=$((i + 1)); cfg=${!j}; }; done
python3 - "$cfg" <<'PY'
import os, sys
p = sys.argv[1]
s = open(p).read()
old = "explicit_http_config: {http2_protocol_options: {allow_connect: true}}"
assert s.count(old) == 1, "the sealing cluster's options moved"
s = s.replace(old, "common_http_protocol_options: {max_requests_per_connection: 1}\n        " + old)
if os.environ.get("KEYLESS") == "1":
    for role in ("seal", "inbound"):
        s = s.replace('"role":"%s"' % role, '"role":"%s","delegated_keys":false' % role)
open(p, "w").write(s)
PY
exec "$REAL_ENVOY" "$@"
WRAP
chmod +x "$work/envoy"
export REAL_ENVOY=${ENVOY:-$PWD/.venv/bin/envoy} ENVOY=$work/envoy
export APP_ADDR=127.0.0.12:8080 APP_GRPC_ADDR=127.0.0.12:8079 REPO_ROOT=$PWD

(cd "$work/www" && exec python3 -m http.server --bind 127.0.0.12 8080 > "$work/app.log" 2>&1) &
app=$!
pair_dir=
cleanup() {
    [[ -n $pair_dir ]] && THEMIS_BENCH_DIR=$pair_dir benchmarks/envoy/themis-pair.sh stop > /dev/null 2>&1 || true
    kill "$app" 2> /dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
sleep 1

for round in $(seq "$ROUNDS"); do
    for mode in delegated keyless; do
        pair_dir=$work/pair-$mode-$round
        echo "round $round, $mode: starting the pair" >&2
        THEMIS_BENCH_DIR=$pair_dir KEYLESS=$([[ $mode == keyless ]] && echo 1 || echo 0) \
            benchmarks/envoy/themis-pair.sh start > "$work/start.out" 2> "$work/start.err" ||
            { cat "$work/start.err" >&2; exit 1; }
        address=$(sed -n 's/^address=//p' "$work/start.out" | tail -n1)
        host=$(sed -n 's/^host=//p' "$work/start.out" | tail -n1)
        for _ in $(seq 20); do curl -s -o /dev/null -H "Host: $host" "http://$address/"; done
        for _ in $(seq "$REQUESTS"); do
            curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -H "Host: $host" "http://$address/"
        done > "$work/$mode-$round.txt"
        signed=$(THEMIS_BENCH_DIR=$pair_dir benchmarks/envoy/themis-pair.sh stats 2>&1 |
            grep -o 'seal.agent_signed[: =]*[0-9]*' | head -n1 || true)
        THEMIS_BENCH_DIR=$pair_dir benchmarks/envoy/themis-pair.sh stop > /dev/null 2>&1 || true
        pair_dir=
        python3 - "$work/$mode-$round.txt" "$mode" "$round" "${signed:-seal.agent_signed: 0}" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
ok = sorted(float(t) * 1000 for code, t in rows if code == "200")
p90 = ok[min(len(ok) - 1, int(0.9 * len(ok)))]
print(f"{sys.argv[2]:9} round {sys.argv[3]}: {len(ok)}/{len(rows)} answered 200, "
      f"median {statistics.median(ok):.2f} ms, p90 {p90:.2f} ms ({sys.argv[4]})")
PY
    done
done
