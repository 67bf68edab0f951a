# Shell helpers shared by bench/run.sh and bench/delivery.sh (sourced, not run).
# Both set CHILD_PID="" first and stop it in their exit trap.

# run_child SECONDS OUTFILE CMD...: CMD under `timeout`, stdout to OUTFILE (- for
# stderr), in the background and waited for, so a signal to the script is handled at once.
run_child() {
    local seconds=$1 out=$2 rc=0
    shift 2
    if [[ $out == - ]]; then
        timeout "$seconds" "$@" >&2 &
    else
        timeout "$seconds" "$@" >"$out" &
    fi
    CHILD_PID=$!
    wait "$CHILD_PID" || rc=$?
    CHILD_PID=""
    return "$rc"
}

# A port nothing listens on (checked by a refused connection).
# Drawn from below the kernel's ephemeral range: a port in it may be the local end of
# an outgoing connection (or one in TIME_WAIT), which the connect test below does not
# see, and binding it would fail.
free_port() {
    local p i low=32768 rest lo=10000 hi
    { read -r low rest </proc/sys/net/ipv4/ip_local_port_range; } 2>/dev/null || low=32768
    hi=$((low - 1))
    # An ephemeral range starting very low leaves no room below it: draw from the old range.
    ((hi > lo + 1000)) || { lo=20000 hi=60999; }
    for i in $(seq 1 200); do
        p=$(shuf -i "$lo-$hi" -n 1)
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# wait_for FILE PATTERN PID SECONDS: until PATTERN shows in FILE, PID dies, or time is up.
wait_for() {
    local file=$1 pattern=$2 pid=$3 seconds=$4 i
    for i in $(seq 1 $((seconds * 10))); do
        grep -q "$pattern" "$file" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
