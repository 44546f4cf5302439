# shellcheck shell=bash
# Debian packages for the set-up scripts (sourced; needs scripts/lib/ui.sh).

# apt_missing PKG...: prints those of PKG that are not installed.
apt_missing() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2> /dev/null | grep -q "install ok installed" || echo "$pkg"
    done
}

# apt_install PKG...: installs them quietly, without prompts or debconf chatter; prints
# apt's output only if it fails (then exits).
apt_install() {
    local out status=0
    ((EUID == 0)) || fail "installing Debian packages needs root: sudo apt-get install $*"
    out=$(mktemp)
    {
        DEBIAN_FRONTEND=noninteractive apt-get update -q &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
    } > "$out" 2>&1 || status=$?
    ((status == 0)) || { cat "$out" >&2; rm -f "$out"; fail "apt-get install $* (exit $status)"; }
    rm -f "$out"
}
