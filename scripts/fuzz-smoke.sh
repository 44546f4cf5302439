#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a bounded time: a smoke test, not a campaign.
#
#   scripts/fuzz-smoke.sh [SECONDS_PER_TARGET]     (default 20)
#   scripts/fuzz-smoke.sh --build-only             build them, run none
#
# Builds all targets once (nightly, AddressSanitizer), then runs each from its corpus
# in fuzz/corpus/TARGET. Exits non-zero if any target crashes; the input that did it
# is left in fuzz/artifacts/TARGET/. See fuzz/README.md for longer runs.
set -euo pipefail
cd "$(dirname "$0")/.."

NIGHTLY=nightly-2026-05-20   # as in scripts/setup.sh
SECONDS_PER_TARGET=${1:-20}
BUILD_ONLY=0
if [[ $SECONDS_PER_TARGET == --build-only ]]; then
    BUILD_ONLY=1
elif ! [[ "$SECONDS_PER_TARGET" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [SECONDS_PER_TARGET | --build-only]" >&2
    exit 2
fi

listed=$(cargo +"$NIGHTLY" fuzz list)
mapfile -t targets <<<"$listed"
if [[ -z "$listed" ]]; then
    echo "fuzz-smoke: no fuzz targets found" >&2
    exit 1
fi

echo "fuzz-smoke: building ${#targets[@]} targets"
cargo +"$NIGHTLY" fuzz build
if ((BUILD_ONLY)); then
    echo "fuzz-smoke: built ${#targets[@]} targets"
    exit 0
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
for target in "${targets[@]}"; do
    printf 'fuzz-smoke: %-20s %ss ... ' "$target" "$SECONDS_PER_TARGET"
    if cargo +"$NIGHTLY" fuzz run "$target" -- \
        -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 >"$log" 2>&1; then
        # libFuzzer's last status line: "#RUNS<tab>DONE cov: N ft: N corp: N/Nb ... exec/s: N ..."
        grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n1 |
            sed -E 's/^#([0-9]+).*cov: ([0-9]+).*exec\/s: ([0-9]+).*/ok: \1 runs, \3 exec\/s, coverage \2/' ||
            echo ok
    else
        echo FAILED
        {   # What went wrong, then the input and how to reproduce it.
            grep -m2 -A2 -E 'panicked at|ERROR: [A-Za-z]+' "$log" || tail -n 30 "$log"
            sed -n '/^Failing input:/,/cargo fuzz run/p' "$log"
        } | sed 's/^/    | /'
        failed+=("$target")
    fi
done

if ((${#failed[@]})); then
    echo "fuzz-smoke: ${#failed[@]} target(s) failed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz-smoke: all ${#targets[@]} targets ran clean"
