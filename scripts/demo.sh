#!/usr/bin/env bash
# The main job, for now: two Themis identities on a real TCP socket on loopback.
# `check` serves; `handler` resolves nothing yet (the DHT comes with the host agent),
# so it is given check's printable id, completes the key agreement, and exchanges
# sealed requests and responses. Then an impostor with its own key tries to pass as
# `check`, and the handler refuses it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --quick
export PATH="$HOME/.cargo/bin:$PATH"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "building the demo (release)"
cargo build -q --release -p themis-net --example tcp_demo
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

serve() { # name key port
    "$demo" serve demo "$2" "127.0.0.1:$3" > "$work/$1.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 50); do grep -q listening "$work/$1.log" && return; sleep 0.1; done
    echo "$1 did not start:"; cat "$work/$1.log"; exit 1
}

step "creating identities in mesh 'demo' (key files are mode 0600)"
check_id=$("$demo" keygen demo "$work/check.key")
handler_id=$("$demo" keygen demo "$work/handler.key")
"$demo" keygen demo "$work/impostor.key" > /dev/null
echo "check:   $check_id"
echo "handler: $handler_id"
ls -l "$work"/*.key | awk '{print "  " $1, $NF}'

step "starting check on 127.0.0.1 (a separate process)"
port=$(free_port)
serve check "$work/check.key" "$port"
cat "$work/check.log"

step "handler calls check by its self-certifying id"
"$demo" call demo "$work/handler.key" "127.0.0.1:$port" "$check_id" \
    "is 7 prime?" "GET /check?n=7 HTTP/1.1"
sleep 0.2
echo "--- check's log:"
cat "$work/check.log"

step "an impostor with its own key listens, and handler expects check's id"
port2=$(free_port)
serve impostor "$work/impostor.key" "$port2"
if "$demo" call demo "$work/handler.key" "127.0.0.1:$port2" "$check_id" "secret for check" 2> "$work/refused.txt"; then
    echo "FAIL: the handler talked to an impostor"; exit 1
fi
echo "handler refused: $(cat "$work/refused.txt")"

step "done: identities, key agreement and sealed request/response work end to end"
