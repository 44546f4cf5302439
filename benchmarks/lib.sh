# Shared by the benchmark drivers (benchmarks/*/run.sh): logging, processes stopped by
# pid only, the work directory kept on failure. Callers define PIDS=() and
# declare -A PID_NAME, and set TMP and KEEP.

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'run.sh: error: %s\n' "$*" >&2; exit 1; }

forget_pid() {
    local keep=() p
    for p in "${PIDS[@]}"; do [[ "$p" == "$1" ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

# stop_pid PID: SIGTERM, up to 5 s to exit, then SIGKILL; always reaped.
stop_pid() {
    local pid=$1 i
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "  ${PID_NAME[$pid]:-pid $pid} ignored SIGTERM; SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    wait "$pid" 2>/dev/null || true
    forget_pid "$pid"
}

# finish_tmp RC: keep $TMP when asked (KEEP=1) or on failure, remove it otherwise.
finish_tmp() {
    local rc=$1
    if ((KEEP)); then
        log "kept $TMP"
    elif ((rc != 0 && rc != 130 && rc != 143)); then
        log "failed: kept $TMP (logs/, results/) for a look; remove it afterwards"
    else
        rm -rf "$TMP"
    fi
}
