# shellcheck shell=bash
# Shared by the benchmark drivers (benchmarks/*/run.sh) and benchmarks/setup.sh:
# logging, processes stopped by pid only, the work directory kept on failure, where
# Fortio is. Callers of stop_pid and finish_tmp define PIDS=() and declare -A PID_NAME,
# and set TMP and KEEP.

FORTIO_VERSION=1.66.5 # newer versions pull a module the Go module proxy does not serve
FORTIO_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/themis-mesh/bin # where benchmarks/setup.sh puts it

# fortio_find: prints the path of Fortio $FORTIO_VERSION: $FORTIO if set (any version),
# else the first of $FORTIO_DIR, $GOBIN, $GOPATH/bin, ~/go/bin and PATH that has that
# version; fails if none has. Runs no go command.
fortio_find() {
    local candidate
    if [[ -n ${FORTIO:-} ]]; then
        [[ -x $FORTIO ]] && echo "$FORTIO"
        return
    fi
    for candidate in "$FORTIO_DIR/fortio" ${GOBIN:+"$GOBIN/fortio"} ${GOPATH:+"${GOPATH%%:*}/bin/fortio"} \
        "$HOME/go/bin/fortio" "$(command -v fortio)"; do
        if [[ -x $candidate && "$("$candidate" version 2> /dev/null)" == "$FORTIO_VERSION" ]]; then
            echo "$candidate"
            return
        fi
    done
    return 1
}

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
