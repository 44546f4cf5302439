#!/usr/bin/env bash
# Runs a command on this machine as if it had no Go, or only Debian 12's Go 1.19, and
# fails if the command ran go or mentioned Fortio (a benchmark-only tool): the demo and
# the tests must not need either (scripts/test.sh runs its set-up and the demo so). The
# Kubernetes test cluster's build (scripts/k8s/build.sh) is the one step that uses Go:
# scripts/test.sh runs it outside this wrapper.
#
#   scripts/without-go.sh [--old-go] CMD...     (root: it uses a mount namespace)
#
# In a private mount namespace, every Go installation on PATH and /usr/local/go is
# covered by an empty tmpfs, and so is ~/go (where Fortio used to be installed). A `go`
# first on PATH stands in for what is left: without --old-go it says "command not found"
# (exit 127), with --old-go it is a Go 1.19 that answers `go version` and `go env`; both
# record every call. Nothing outside the namespace changes.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh

old=0
[[ ${1:-} == --old-go ]] && { old=1; shift; }
(($#)) || { echo "usage: $0 [--old-go] CMD..." >&2; exit 2; }
((EUID == 0)) || fail "$0 needs root (unshare --mount)"

if [[ ${THEMIS_WITHOUT_GO:-} != inside ]]; then
    shim=$(mktemp -d /tmp/themis-without-go.XXXXXX)
    trap 'rm -rf "$shim"' EXIT
    status=0
    THEMIS_WITHOUT_GO=inside THEMIS_GO_SHIM=$shim OLD_GO=$old \
        unshare --mount --propagation private "$0" "$@" 2>&1 | tee "$shim/output" || status=$?
    ((status == 0)) || fail "$* failed (exit $status) without Go"
    if [[ -s $shim/calls ]] || grep -q 'go: command not found\|go: not found' "$shim/output"; then
        fail "$* ran go: $(paste -sd';' "$shim/calls" 2> /dev/null)"
    fi
    if grep -qi 'fortio\|golang' "$shim/output"; then
        fail "$* mentioned Fortio or Go: $(grep -i 'fortio\|golang' "$shim/output" | head -n3)"
    fi
    echo "    ok  $* ran without Go (and never called go)"
    exit 0
fi

# --- inside the mount namespace ------------------------------------------------------
hide() { mount -t tmpfs -o size=1m,mode=0755 themis-without-go "$1"; }
for go in $(type -ap go) /usr/local/go/bin/go; do
    [[ -e $go ]] || continue
    root=$(dirname "$(dirname "$(realpath "$go")")")
    case $root in
        / | /usr | /usr/local | "$HOME") fail "cannot hide $go: its directory $root is not a Go installation" ;;
    esac
    [[ -f $root/VERSION || -d $root/pkg/tool ]] || fail "cannot hide $go: $root does not look like a Go installation"
    hide "$root"
done
[[ -d $HOME/go ]] && hide "$HOME/go"

mkdir -p "$THEMIS_GO_SHIM/bin"
cat > "$THEMIS_GO_SHIM/bin/go" << EOF
#!/bin/sh
echo "go \$*" >> "$THEMIS_GO_SHIM/calls"
if [ "$OLD_GO" = 1 ]; then
    case "\$1" in
        version) echo "go version go1.19.8 linux/amd64"; exit 0 ;;
        env) [ "\$2" = GOVERSION ] && echo go1.19.8; exit 0 ;;
    esac
    echo "go: unknown command" >&2; exit 2
fi
echo "go: command not found" >&2
exit 127
EOF
chmod +x "$THEMIS_GO_SHIM/bin/go"
((OLD_GO)) || rm "$THEMIS_GO_SHIM/bin/go" # absent: no go at all
export PATH="$THEMIS_GO_SHIM/bin:$PATH"
if ((OLD_GO)); then
    [[ "$(go version)" == *go1.19* ]] || fail "the Go 1.19 stand-in is not first on PATH"
    : > "$THEMIS_GO_SHIM/calls" # that check is ours, not the command's
else
    ! command -v go > /dev/null || fail "go is still on PATH: $(command -v go)"
fi
exec "$@"
