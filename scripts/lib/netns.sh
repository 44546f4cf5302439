# shellcheck shell=bash
# Nodes and pods on one machine, for scripts/demo.sh (sourced; bash, set -euo pipefail).
#
#   node  = a network namespace with one veth on a shared bridge (the "fabric", itself
#           in a namespace of its own) and its own /etc/hosts (/etc/netns/<ns>/hosts,
#           which `ip netns exec` bind-mounts over /etc/hosts);
#   pod   = a cgroup v2 directory with two children, `app` and `proxy`.
#
# Nothing here touches the root namespace's interfaces, routes or firewall: every link
# is created inside the namespaces (`ip -n`). Every process started here is recorded
# in the file $PID_FILE as "PID START NAME" (START: its start time, so that a pid the
# system has reused since is never mistaken for it), so that exactly those can be
# stopped, also by a later run (scripts/demo.sh --down).

# shellcheck disable=SC2034 # used by the scripts that source this
CGROUP_FS=/sys/fs/cgroup/unified

# Creates the fabric namespace FAB with a bridge, and one namespace per "NS=IP/LEN"
# argument, joined to the bridge by a veth pair (vN in the fabric, eth0 in the node).
fabric_up() { # FAB NS=IP/LEN...
    local fab=$1 n=0 spec ns
    shift
    ip netns add "$fab"
    ip -n "$fab" link set lo up
    ip -n "$fab" link add br0 type bridge
    ip -n "$fab" link set br0 up
    for spec in "$@"; do
        n=$((n + 1))
        ns=${spec%%=*}
        ip netns add "$ns"
        ip -n "$fab" link add "v$n" type veth peer name eth0 netns "$ns"
        ip -n "$fab" link set "v$n" master br0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "${spec#*=}" dev eth0
        ip -n "$ns" link set eth0 up
    done
}

# Writes NS's own /etc/hosts: localhost plus the given "IP NAME" lines.
hosts_file() { # NS LINE...
    local ns=$1
    shift
    mkdir -p "/etc/netns/$ns"
    printf '%s\n' "127.0.0.1 localhost" "$@" > "/etc/netns/$ns/hosts"
}

# Removes namespaces (and their /etc/netns entries); quiet about those already gone.
netns_down() { # NS...
    local ns
    for ns in "$@"; do
        ip netns del "$ns" 2> /dev/null || true
        rm -rf "/etc/netns/${ns:?}"
    done
    rmdir /etc/netns 2> /dev/null || true # if nothing else uses it
}

# Creates a pod: DIR, DIR/app and DIR/proxy.
pod_cgroup() { # DIR
    mkdir -p "$1/app" "$1/proxy"
}

# Removes a cgroup tree, children first. The processes in it must be gone; a cgroup
# can stay busy for a moment after its last process is reaped, hence the retries.
cgroup_remove() { # DIR
    local dir=$1
    [[ -d $dir ]] || return 0
    for _ in $(seq 30); do
        find "$dir" -depth -type d -exec rmdir {} + 2> /dev/null || true
        [[ -d $dir ]] || return 0
        sleep 0.1
    done
    echo "could not remove $dir (processes left: $(find "$dir" -name cgroup.procs -exec cat {} + | tr '\n' ' '))" >&2
    return 1
}

# Starts CMD in the background in namespace NS, its output to LOG, and records it in
# $PID_FILE (its pid also in `last_pid`). With a cgroup CG, it runs there, with NS's /etc/hosts and a
# clean environment: a pod's process. With CG = -, it only enters NS's network: a
# node's daemon (it keeps the machine's /sys, where bpffs and the cgroups are mounted,
# which `ip netns exec` would replace). Every step execs, so the pid is CMD's own.
spawn() { # NAME NS CG LOG CMD...
    local name=$1 ns=$2 cg=$3 log=$4
    shift 4
    if [[ $cg == - ]]; then
        nsenter --net="/run/netns/$ns" -- "$@" > "$log" 2>&1 &
    else
        pod_exec "$ns" "$cg"
        "${pod_cmd[@]}" "$@" > "$log" 2>&1 &
    fi
    last_pid=$!
    echo "$last_pid $(pid_start "$last_pid") $name" >> "$PID_FILE"
}

# The start time of process PID (clock ticks since boot), or nothing if it is gone.
pid_start() { # PID
    local stat
    stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 0
    stat=${stat##*) }
    # shellcheck disable=SC2086 # split the fields
    set -- $stat
    echo "${20}"
}

# Prints the pids recorded in $PID_FILE whose name matches the glob PATTERN and which
# are still the processes that were started (same start time).
recorded_pids() { # PATTERN
    local pid start name
    [[ -f $PID_FILE ]] || return 0
    while read -r pid start name; do
        # shellcheck disable=SC2053 # a glob on purpose
        [[ $name == $1 && -n $start && "$(pid_start "$pid")" == "$start" ]] && echo "$pid"
    done < "$PID_FILE"
    return 0
}

# Sets `pod_cmd` to the command prefix that runs a command as a process of pod cgroup
# CG in namespace NS: it joins the cgroup before entering the namespace (inside, /sys
# is the namespace's own), then execs. A simple command, so that `&` gives its pid.
pod_exec() { # NS CG
    # shellcheck disable=SC2016 # $$ and $1 are that sh's
    pod_cmd=(sh -c 'echo $$ > "$1/cgroup.procs" || exit 1; shift; exec "$@"' sh "$2"
        ip netns exec "$1" env -i PATH="$PATH" HOME=/tmp LANG=C.UTF-8)
}

# Runs CMD in the foreground as a process of pod cgroup CG in namespace NS.
in_pod() { # NS CG CMD...
    pod_exec "$1" "$2"
    shift 2
    "${pod_cmd[@]}" "$@"
}

# Runs CMD with only NS's network (not in any pod): a process of the node itself.
on_node() { # NS CMD...
    local ns=$1
    shift
    nsenter --net="/run/netns/$ns" -- "$@"
}

# Whether PID is a live process (a zombie is not).
running() { # PID
    local stat
    stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}

any_running() { # PID...
    local pid
    for pid in "$@"; do running "$pid" && return 0; done
    return 1
}

# Stops processes started by spawn: SIGTERM, up to 5 s for all of them, then SIGKILL.
stop_pids() { # PID...
    local pid
    (($#)) || return 0
    kill -TERM "$@" 2> /dev/null || true
    for _ in $(seq 50); do
        any_running "$@" || break
        sleep 0.1
    done
    for pid in "$@"; do
        running "$pid" && kill -KILL "$pid" 2> /dev/null
        wait "$pid" 2> /dev/null || true
    done
    return 0
}

# Retries CMD (quietly) every 0.2 s, up to TRIES times.
retry() { # TRIES CMD...
    local tries=$1
    shift
    for _ in $(seq "$tries"); do
        "$@" > /dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}

# Like retry, but gives up as soon as process PID is gone (it failed to start).
retry_while() { # PID TRIES CMD...
    local pid=$1 tries=$2
    shift 2
    for _ in $(seq "$tries"); do
        "$@" > /dev/null 2>&1 && return 0
        running "$pid" || return 1
        sleep 0.2
    done
    return 1
}
