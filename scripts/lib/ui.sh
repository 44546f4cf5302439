# shellcheck shell=bash
# Output helpers for the scripts (sourced): headings in bold on a terminal, plain text
# everywhere else (logs, pipes, CI), so no escape codes end up in files. NO_COLOR set
# to anything turns bold off on a terminal too.

if [[ -t 1 && -z ${NO_COLOR:-} ]]; then ui_bold=$'\033[1m' ui_plain=$'\033[0m'; else ui_bold="" ui_plain=""; fi
if [[ -t 2 && -z ${NO_COLOR:-} ]]; then ui_bold2=$'\033[1m' ui_plain2=$'\033[0m'; else ui_bold2="" ui_plain2=""; fi

# A heading: "==> what happens now".
step() { printf '%s==> %s%s\n' "$ui_bold" "$*" "$ui_plain"; }
# Something that was already there.
ok() { printf '    ok  %s\n' "$*"; }
# Indents what it reads by four spaces.
indent() { sed 's/^/    /'; }
# An error the user must act on; exits 1.
fail() {
    printf '%sFAIL:%s %s\n' "$ui_bold2" "$ui_plain2" "$*" >&2
    exit 1
}
