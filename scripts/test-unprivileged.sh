#!/usr/bin/env bash
# Runs the workspace's test executables as an unprivileged user (nobody), as a
# plain `cargo test` by an ordinary user would (those of packages that touch no
# process, file, socket or uid are not run again: their result cannot depend on it): the tests that need root, Envoy, the
# kernel, a tool or a nested build skip and say why (themis-testkit's `require`), and
# every other test must pass. Prints how many tests passed and how many were skipped,
# by reason. As root (it switches to nobody with setpriv); the checkout and its
# target/ must be readable by other users (a clone made with umask 022, outside
# /root).
#
#   scripts/test-unprivileged.sh
#
# It builds the tests first (`cargo test --workspace --no-run`; nothing new when the
# native tests ran just before) and runs each executable the way Cargo does: in its
# package's directory, with CARGO_MANIFEST_DIR and CARGO_PKG_NAME set, and without
# THEMIS_REQUIRE_ALL (with it, a skip would fail).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ui.sh
source scripts/lib/ui.sh
export PATH="$HOME/.cargo/bin:$PATH"

USER_ID=65534 # nobody
[[ $(id -u) == 0 ]] || fail "run as root: it runs the tests as nobody (uid $USER_ID) with setpriv"
command -v setpriv >/dev/null || fail "setpriv (util-linux) is missing"
as_nobody() { setpriv --reuid=$USER_ID --regid=$USER_ID --clear-groups "$@"; }

started=$SECONDS
work=$(mktemp -d /tmp/themis-unprivileged.XXXXXX)
trap 'rm -rf "$work"' EXIT
# nobody's home and temporary directory (agents' state, the tests' files).
home="$work/home"
mkdir -p "$home"
chown "$USER_ID:$USER_ID" "$home"
chmod 755 "$work"

# The test executables and their packages, from Cargo's build messages.
cargo test --workspace --no-run --message-format=json 2>"$work/build.log" >"$work/build.json" ||
    { cat "$work/build.log" >&2; fail "cargo test --workspace --no-run failed"; }
built=$SECONDS
python3 - "$work/build.json" >"$work/tests.tsv" 2>"$work/pure.txt" <<'EOF'
import json, os, re, sys
# A package none of whose sources starts a process, touches files, sockets or uids, or
# asks `require` runs the same for any user: its tests ran as root just before, and
# are not run again (listed on stderr, printed below).
TOUCHES = re.compile(r"themis_testkit|Command::new|require::|PermissionsExt|set_permissions"
                     r"|getuid|geteuid|from_mode|std::fs::|tempfile|UnixListener|/proc/")
def pure(package, cache={}):
    if package not in cache:
        cache[package] = not any(
            TOUCHES.search(open(os.path.join(d, f), errors="replace").read())
            for sub in ("src", "tests", "benches")
            for d, _, files in os.walk(os.path.join(package, sub))
            for f in files if f.endswith(".rs"))
    return cache[package]
seen = set()
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("profile", {}).get("test"):
        continue
    exe = m.get("executable")
    if not exe or exe in seen:
        continue
    seen.add(exe)
    package = os.path.dirname(m["manifest_path"])
    # "path+file:///…/<dir>#<name>@<version>", or "…/<name>#<version>" when the
    # directory is named like the package.
    url, _, fragment = m["package_id"].partition("#")
    name = fragment.split("@")[0] if "@" in fragment else url.rsplit("/", 1)[-1]
    if pure(package):
        print(f"{name} {m['target']['name']}", file=sys.stderr)
        continue
    print(f"{exe}\t{package}\t{name}\t{m['target']['name']}")
EOF
echo "    not run again, the same for any user (their packages touch no process, file, socket or uid; they passed as root above): $(awk '{print $1}' "$work/pure.txt" | sort | uniq -c | awk '{printf "%s%s (%s executables)", sep, $2, $1; sep=", "}')"
count=$(wc -l <"$work/tests.tsv")
((count > 0)) || fail "cargo listed no test executables"

# nobody must reach the checkout, the packages and the executables.
while IFS=$'\t' read -r exe package _ _; do
    as_nobody test -x "$exe" -a -r "$package" -a -x "$package" ||
        fail "nobody cannot run $exe in $package: the checkout and target/ must be readable and searchable by other users (clone with umask 022, outside /root)"
done <"$work/tests.tsv"

# The `themis` the build above made (for themis-cli's tests) serves every package's, as
# in scripts/test.sh: nobody cannot build it again (testkit::agent::themis_binary).
tool="${CARGO_TARGET_DIR:-$PWD/target}/debug/themis"
as_nobody test -x "$tool" || fail "nobody cannot run $tool"

failed=()
while IFS=$'\t' read -r exe package name target; do
    log="$work/$name-$target.log"
    printf '    %-20s %-22s ' "$name" "$target"
    if (cd "$package" && env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" TMPDIR="$home" \
        USER=nobody LANG=C.UTF-8 CARGO_MANIFEST_DIR="$package" CARGO_PKG_NAME="$name" THEMIS_TOOL="$tool" \
        setpriv --reuid=$USER_ID --regid=$USER_ID --clear-groups "$exe") </dev/null >"$log" 2>&1; then
        grep -h '^test result:' "$log" | sed -E 's/^test result: //; s/; 0 measured; 0 filtered out//' || echo ok
    else
        echo FAILED
        failed+=("$name $target")
        tail -n 40 "$log" | indent
    fi
done <"$work/tests.tsv"

# (-o: a test's line may share a line of the log with libtest's own output.)
cat "$work"/*.log | grep -ohE 'skipped [^ :]+: needs .*; scripts/test.sh runs it' >"$work/skipped" || true
sum() { cat "$work"/*.log | grep -h '^test result:' | grep -oE "[0-9]+ $1" | awk '{n += $1} END {print n + 0}'; }
skipped=$(wc -l <"$work/skipped")
echo
echo "    $count test executables as nobody in $((SECONDS - built)) s (and $((built - started)) s to build them): $(sum passed) passed (of which $skipped skipped), $(sum failed) failed, $(sum ignored) ignored"
if ((skipped > 0)); then
    echo "    skipped, by reason:"
    sed -E 's/^skipped [^:]+: //' "$work/skipped" | sort | uniq -c | sort -rn | indent
fi
((${#failed[@]} == 0)) || fail "failed as nobody: ${failed[*]}"
