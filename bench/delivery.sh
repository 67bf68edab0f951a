#!/usr/bin/env bash
# Switchboard end-to-end delivery benchmark: EVENTS live email events (`welcome`) through
# POST /v1/events/bulk, the worker, the provider plugin, the provider simulator, its
# signed callback and the receipt consumer, until every message is DELIVERED; then the
# same with a test key (no provider call), and then live events again with a webhook
# endpoint registered (a local receiver the driver runs, told of every message.sent and
# message.delivered). Run on both backend sets:
#   embedded    `switchboard dev` (SQLite, embedded queue, in-memory counters; the
#               simulator inside the process, as the quick start runs it)
#   production  `switchboard serve` on PostgreSQL, NATS JetStream and Redis, with
#               `switchboard sim` as a separate process
# Every message is read back and checked (bench/src/bin/delivery.rs). See bench/README.md.
#
# Settings (environment variables, defaults in brackets):
#   EVENTS [20000]        live events per backend set
#   BULK [5000]           events per bulk request (the gateway takes at most 5000)
#   TEST_EVENTS [5000]    events of the test-key variant; 0 skips it
#   ENDPOINT_EVENTS [5000]  live events of the webhook-endpoint variant; 0 skips it
#   SETS ["embedded production"]  backend sets to run, in order
#   DEADLINE [600]        seconds after the last bulk answer for every message to be final
#   STALL [60]            seconds without any worker outcome or receipt: the pipeline is stuck
#   VERIFY_CONCURRENCY [16]  GET /v1/events/{id} in flight while checking messages
#   CALLBACK_DELAY_MS []  the simulator's delay before a callback (its default: 300)
#   SKIP_BUILD [0]        1: use the existing target/release binaries
#   BIN_DIR [target/release]  where the binaries are (another build's, to compare
#                         commits on one machine; implies SKIP_BUILD=1)
#   KEEP_DB [0]           1: keep the production set's database afterwards
#   BENCH_LOG [warn]      the embedded gateway's log filter (SWITCHBOARD_LOG), e.g.
#                         `warn,sqlx::query=debug` to time every statement it runs
#   BUILD_TIMEOUT [5400]  seconds the release build may take (cargo may wait on a lock)
#   PG_URL_BASE [postgres://postgres@127.0.0.1:5432]  NATS_URL [nats://127.0.0.1:4222]
#   REDIS_URL [redis://127.0.0.1:6379]
#   PGSSLMODE []          read by psql and by the gateway alike: `disable` keeps TLS off
#                         the PostgreSQL connections (the default, `prefer`, uses it when
#                         the server offers it, as Debian's does)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

EVENTS=${EVENTS:-20000}
BULK=${BULK:-5000}
TEST_EVENTS=${TEST_EVENTS:-5000}
ENDPOINT_EVENTS=${ENDPOINT_EVENTS:-5000}
SETS=${SETS:-embedded production}
DEADLINE=${DEADLINE:-600}
STALL=${STALL:-60}
VERIFY_CONCURRENCY=${VERIFY_CONCURRENCY:-16}
CALLBACK_DELAY_MS=${CALLBACK_DELAY_MS:-}
SKIP_BUILD=${SKIP_BUILD:-0}
BIN_DIR=${BIN_DIR:-}
[[ -n $BIN_DIR ]] && SKIP_BUILD=1
KEEP_DB=${KEEP_DB:-0}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-5400}
PG_URL_BASE=${PG_URL_BASE:-postgres://postgres@127.0.0.1:5432}
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}

# The exact command line, with every setting that was overridden.
OVERRIDES=""
for v in EVENTS BULK TEST_EVENTS ENDPOINT_EVENTS SETS DEADLINE STALL VERIFY_CONCURRENCY CALLBACK_DELAY_MS \
    SKIP_BUILD BIN_DIR KEEP_DB BENCH_LOG BUILD_TIMEOUT PG_URL_BASE NATS_URL REDIS_URL PGSSLMODE; do
    if printenv "$v" >/dev/null 2>&1; then
        val=$(printenv "$v")
        [[ $val == *" "* ]] && val="\"$val\""
        OVERRIDES+="$v=$val "
    fi
done
COMMAND_LINE="${OVERRIDES}bash bench/delivery.sh${*:+ $*}"

log() { printf '[delivery %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    log "FAILED: $*"
    exit 1
}

for tool in jq psql sqlite3 curl shuf timeout awk od; do
    command -v "$tool" >/dev/null || die "$tool is required"
done
for n in EVENTS BULK TEST_EVENTS ENDPOINT_EVENTS DEADLINE STALL VERIFY_CONCURRENCY BUILD_TIMEOUT; do
    [[ ${!n} =~ ^[0-9]+$ ]] || die "$n must be a whole number, got '${!n}'"
done
[[ -z $CALLBACK_DELAY_MS || $CALLBACK_DELAY_MS =~ ^[0-9]+$ ]] ||
    die "CALLBACK_DELAY_MS must be a whole number of milliseconds"
((EVENTS >= 1 && EVENTS <= 1000000)) || die "EVENTS must be 1 to 1000000"
((TEST_EVENTS <= 1000000)) || die "TEST_EVENTS must be 0 to 1000000"
((ENDPOINT_EVENTS <= 1000000)) || die "ENDPOINT_EVENTS must be 0 to 1000000"
((BULK >= 1 && BULK <= 5000)) || die "BULK must be 1 to 5000"
((DEADLINE >= 1 && DEADLINE <= 3600)) || die "DEADLINE must be 1 to 3600"
((STALL <= 3600)) || die "STALL must be 0 (off) to 3600"
for set in $SETS; do
    [[ $set == embedded || $set == production ]] || die "SETS: unknown backend set '$set'"
done

RUN_ID="$(date +%Y%m%d%H%M%S)_$$"
DB="sb_bench_dlv_${RUN_ID}"
STREAM_PREFIX="SBDLV_${RUN_ID}"
STREAMS=("${STREAM_PREFIX}_CRITICAL" "${STREAM_PREFIX}_BULK" "${STREAM_PREFIX}_TELEMETRY" "${STREAM_PREFIX}_WEBHOOKS")
SUBJECT_PREFIX="sbdlv_${RUN_ID}"
COUNTER_PREFIX="sbdlv:${RUN_ID}:"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sb-delivery.XXXXXX")
chmod 700 "$WORK"
OUT="$ROOT/bench/out/delivery"
rm -rf "$OUT"
mkdir -p "$OUT"
BINS=${BIN_DIR:-$ROOT/target/release}
SB="$BINS/switchboard"
DRIVER="$BINS/delivery"
LOADGEN="$BINS/loadgen"
TICKS=$(getconf CLK_TCK 2>/dev/null || echo 100)

GATEWAY_PID=""
SIM_PID=""
CHILD_PID=""
TOP_PID=""
DB_CREATED=""
STREAMS_MAY_EXIST=""
FAILURES=()

# Sends TERM, waits up to 10 s, then KILL: only the pids this script started.
stop_pid() {
    local pid=$1 i
    [[ -n $pid ]] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "pid $pid did not stop within 10 s: killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

delete_streams() {
    [[ -n $STREAMS_MAY_EXIST && -x $LOADGEN ]] || return 0
    local args=() s
    for s in "${STREAMS[@]}"; do args+=(--stream "$s"); done
    if timeout 30 "$LOADGEN" --cleanup --nats-url "$NATS_URL" "${args[@]}" >"$OUT/streams-cleanup.json" 2>"$OUT/streams-cleanup.err"; then
        STREAMS_MAY_EXIST=""
    else
        log "could not delete streams ${STREAMS[*]} (see $OUT/streams-cleanup.err)"
    fi
}

# Rate-limit windows expire on their own; delete the run's keys anyway.
delete_redis_keys() {
    command -v redis-cli >/dev/null || return 0
    timeout 30 redis-cli -u "$REDIS_URL" --scan --pattern "${COUNTER_PREFIX}*" 2>/dev/null |
        timeout 30 xargs -r -n 500 redis-cli -u "$REDIS_URL" del >/dev/null 2>&1 || true
}

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_pid "$CHILD_PID"
    stop_pid "$TOP_PID"
    stop_pid "$SIM_PID"
    stop_pid "$GATEWAY_PID"
    delete_streams
    if [[ -n $DB_CREATED ]]; then
        if [[ $KEEP_DB == 1 ]]; then
            log "kept database $DB (KEEP_DB=1)"
        else
            # A drop can wait behind a busy checkpoint: give it time, then look again.
            timeout 120 psql "$PG_URL_BASE/postgres" -q -v ON_ERROR_STOP=1 \
                -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 ||
                [[ $(timeout 30 psql "$PG_URL_BASE/postgres" -tA -c "SELECT count(*) FROM pg_database WHERE datname = '$DB'" 2>/dev/null) == 0 ]] ||
                log "could not drop database $DB (drop it by hand)"
        fi
    fi
    [[ $SETS == *production* ]] && delete_redis_keys
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# run_child, free_port, wait_for.
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

# Sets GW_PORT, SIM_PORT and MET_PORT to three distinct free ports.
pick_ports() {
    local i
    for i in $(seq 1 20); do
        GW_PORT=$(free_port) && SIM_PORT=$(free_port) && MET_PORT=$(free_port) || die "no free port"
        [[ $GW_PORT != "$SIM_PORT" && $GW_PORT != "$MET_PORT" && $SIM_PORT != "$MET_PORT" ]] && return 0
    done
    die "no three distinct free ports"
}

# wait_http URL PID SECONDS: until URL answers 2xx, PID dies, or time is up. A
# "listening on" line comes before every listener is bound (metrics, simulator).
wait_http() {
    local url=$1 pid=$2 seconds=$3 i
    for i in $(seq 1 $((seconds * 10))); do
        curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

random_hex() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }

# One `top` snapshot 15 s into a live run: who uses the CPUs while messages flow.
top_snapshot() {
    (sleep 15 && top -b -n1 -w 200 2>/dev/null | head -25 >"$1") &
    TOP_PID=$!
}

# run_variant SET MODE EVENTS KEYFILE DRIVER-ARGS...: one driver run; its report goes to
# $OUT/SET-MODE.json. MODE `live+endpoint` is a live run with a webhook endpoint. A run that fails a check (exit 2) is recorded and the benchmark goes
# on (with the next backend set if messages were left pending: they would mix into the
# next variant's); anything else stops it. Returns 1 when messages were left pending.
run_variant() {
    local set=$1 mode=$2 events=$3 keyfile=$4 rc=0
    shift 4
    local endpoint=()
    [[ $mode == *+endpoint ]] && endpoint=(--endpoint)
    local cmd=("$DRIVER" --url "http://127.0.0.1:$GW_PORT" --key-file "$keyfile" --mode "${mode%%+*}" "${endpoint[@]}"
        --events "$events" --bulk "$BULK" --deadline "$DEADLINE" --stall "$STALL"
        --verify-concurrency "$VERIFY_CONCURRENCY" --clk-tck "$TICKS" --label "$set-$mode" "$@")
    log "$set, $mode key: $events events in bulk requests of $BULK"
    [[ $mode == live ]] && top_snapshot "$OUT/top-$set.txt"
    # The deadline bounds the wait; bulk requests and the read-back have their own timeouts.
    run_child $((DEADLINE + 900)) "$OUT/$set-$mode.json" "${cmd[@]}" || rc=$?
    stop_pid "$TOP_PID"
    TOP_PID=""
    case $rc in
        0) log "$set, $mode key: every message DELIVERED and checked" ;;
        2)
            FAILURES+=("$set/$mode")
            log "$set, $mode key: CHECKS FAILED: $(jq -r '.problems | join("; ")' "$OUT/$set-$mode.json" 2>/dev/null)"
            if [[ $(jq -r .complete "$OUT/$set-$mode.json" 2>/dev/null) != true ]]; then
                log "$set: skipping its remaining runs (messages still pending would mix into them)"
                return 1
            fi
            ;;
        *) die "the delivery driver failed ($set, $mode key; exit $rc)" ;;
    esac
}

# db_checks SET QUERY-CMD...: store-side counts (same SQL on SQLite and PostgreSQL),
# to $OUT/SET-db.txt.
db_checks() {
    local set=$1
    shift
    {
        echo "messages by status and key mode:"
        "$@" "SELECT status, CASE WHEN test_mode THEN 'test' ELSE 'live' END, count(*) FROM messages GROUP BY 1, 2 ORDER BY 1, 2;"
        echo "timeline entries by status:"
        "$@" "SELECT status, count(*) FROM message_events GROUP BY 1 ORDER BY 1;"
        echo "delivery attempts by state:"
        "$@" "SELECT state, count(*) FROM delivery_attempts GROUP BY 1 ORDER BY 1;"
        echo "messages with more than one attempt:"
        "$@" "SELECT count(*) FROM (SELECT event_id FROM delivery_attempts GROUP BY event_id HAVING count(*) > 1) AS x;"
        echo "receipts by state:"
        "$@" "SELECT state, count(*) FROM receipts GROUP BY 1 ORDER BY 1;"
        echo "outbox rows:"
        "$@" "SELECT count(*) FROM outbox;"
        echo "webhook deliveries by status:"
        "$@" "SELECT status, count(*) FROM webhook_deliveries GROUP BY 1 ORDER BY 1;"
    } >"$OUT/$set-db.txt" 2>&1 || log "some store checks failed (see $OUT/$set-db.txt)"
}

# ---------------------------------------------------------------- build
if [[ $SKIP_BUILD != 1 ]]; then
    log "building release binaries (may wait for other builds' cargo lock; bounded by ${BUILD_TIMEOUT}s)"
    run_child "$BUILD_TIMEOUT" - cargo build --release -p switchboard -p switchboard-bench ||
        die "release build failed or timed out"
fi
for b in "$SB" "$DRIVER" "$LOADGEN"; do
    [[ -x $b ]] || die "$b is missing (build first, or unset SKIP_BUILD)"
done

# ---------------------------------------------------------------- embedded
run_embedded() {
    local dir=$WORK/embedded
    mkdir -p "$dir/data"
    pick_ports
    local sim_port=$SIM_PORT met_port=$MET_PORT
    local env=(-u SWITCHBOARD_CONFIG SWITCHBOARD_LOG=${BENCH_LOG:-warn} NO_COLOR=1
        "SWITCHBOARD_LISTEN=127.0.0.1:$GW_PORT" "SWITCHBOARD_DATA_DIR=$dir/data"
        "SWITCHBOARD_SIM__LISTEN=127.0.0.1:$sim_port" "SWITCHBOARD_METRICS_LISTEN=127.0.0.1:$met_port")
    [[ -n $CALLBACK_DELAY_MS ]] && env+=("SWITCHBOARD_SIM__CALLBACK_DELAY_MS=$CALLBACK_DELAY_MS")
    log "embedded: starting switchboard dev on 127.0.0.1:$GW_PORT (simulator 127.0.0.1:$sim_port, data in a temp dir)"
    # stdout carries the keys `dev` prints once: it stays in the temp dir.
    env "${env[@]}" "$SB" dev >"$dir/dev.out" 2>"$OUT/embedded-gateway.log" &
    GATEWAY_PID=$!
    { wait_for "$dir/dev.out" "listening on" "$GATEWAY_PID" 300 &&
        wait_http "http://127.0.0.1:$GW_PORT/v1/health" "$GATEWAY_PID" 30 &&
        wait_http "http://127.0.0.1:$met_port/metrics" "$GATEWAY_PID" 30 &&
        wait_http "http://127.0.0.1:$sim_port/_sim/stats" "$GATEWAY_PID" 30; } ||
        {
            tail -20 "$OUT/embedded-gateway.log" >&2
            die "switchboard dev did not start (or one of its ports was taken meanwhile)"
        }
    grep -q 'default workspace.s providers now route to it' "$dir/dev.out" ||
        die "dev did not route the default workspace through the simulator"
    local mode
    for mode in live test; do
        sed -n "s/^created workspace \`default\`: $mode key \\([^ ]*\\) (shown once)\$/\\1/p" "$dir/dev.out" >"$dir/$mode.key"
        [[ -s $dir/$mode.key ]] || die "dev printed no $mode key"
    done
    log "embedded: dev up (pid $GATEWAY_PID), workspace default with its live and test keys"

    local common=(--sim-url "http://127.0.0.1:$sim_port" --metrics-url "http://127.0.0.1:$met_port"
        --gateway-pid "$GATEWAY_PID" --watch "gateway=$GATEWAY_PID")
    if run_variant embedded live "$EVENTS" "$dir/live.key" "${common[@]}"; then
        if ((TEST_EVENTS == 0)) || run_variant embedded test "$TEST_EVENTS" "$dir/test.key" "${common[@]}"; then
            ((ENDPOINT_EVENTS == 0)) ||
                run_variant embedded live+endpoint "$ENDPOINT_EVENTS" "$dir/live.key" "${common[@]}" || true
        fi
    fi
    kill -0 "$GATEWAY_PID" 2>/dev/null || die "switchboard dev died (see $OUT/embedded-gateway.log)"
    log "embedded: stopping dev"
    stop_pid "$GATEWAY_PID"
    GATEWAY_PID=""
    sq() { timeout 60 sqlite3 -readonly "$dir/data/switchboard.db" "$1"; }
    db_checks embedded sq
}

# ---------------------------------------------------------------- production
run_production() {
    local dir=$WORK/production
    mkdir -p "$dir/data"
    pick_ports
    local sim_port=$SIM_PORT met_port=$MET_PORT ws="delivery-$RUN_ID" slug
    log "production: creating database $DB"
    timeout 30 psql "$PG_URL_BASE/postgres" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $DB" >/dev/null ||
        die "cannot create database $DB"
    DB_CREATED=1

    # One file configures serve, sim and the operator commands. The run's own streams,
    # subjects, consumer and key prefix leave the machine's defaults untouched; the
    # simulator signs callbacks with the secrets the gateway is given below.
    declare -A secret
    for slug in prova provb provc provd prove; do secret[$slug]="whsec_$(random_hex)"; done
    local cfg=$dir/switchboard.toml
    (
        umask 077
        cat >"$cfg" <<EOF
listen = "127.0.0.1:$GW_PORT"
metrics_listen = "127.0.0.1:$met_port"
data_dir = "$dir/data"

[store]
url = "$PG_URL_BASE/$DB"

[broker]
url = "$NATS_URL"

[broker.streams]
critical = "${STREAMS[0]}"
bulk = "${STREAMS[1]}"
telemetry = "${STREAMS[2]}"
subject_prefix = "$SUBJECT_PREFIX"
telemetry_subject = "$SUBJECT_PREFIX.telemetry.receipts"
webhooks = "${STREAMS[3]}"
webhooks_subject = "$SUBJECT_PREFIX.webhooks.events"
plugins_subject = "$SUBJECT_PREFIX.plugins.changed"
revocations_subject = "$SUBJECT_PREFIX.keys.revoked"

[counters]
url = "$REDIS_URL"
key_prefix = "$COUNTER_PREFIX"

[worker]
consumer = "sbdlv-$RUN_ID"

# The endpoint variant's receiver is the driver, on 127.0.0.1 over http.
[webhook_endpoints]
allow_http = true
allow_private_networks = true

# The bundled plugins may reach the simulator (as dev grants them).
[plugins.grants]
$(for slug in prova provb provc provd prove; do echo "$slug = [\"127.0.0.1:$sim_port\"]"; done)

[sim]
listen = "127.0.0.1:$sim_port"
gateway_url = "http://127.0.0.1:$GW_PORT"
${CALLBACK_DELAY_MS:+callback_delay_ms = $CALLBACK_DELAY_MS}

[sim.secrets]
$(for slug in prova provb provc provd prove; do echo "$slug = \"${secret[$slug]}\""; done)
EOF
    )
    # The `welcome` workflow as `dev` seeds it (host/src/workflow.rs, DEV_EXAMPLES).
    cat >"$dir/welcome.yaml" <<'EOF'
workflows:
  - name: welcome
    description: Greets a new user by email, push or SMS.
    email:
      subject: "Welcome, {{name}}!"
      html: "<p>Hello {{name}}, welcome aboard.</p>"
      text: "Hello {{name}}, welcome aboard."
    push:
      title: "Welcome, {{name}}"
      body: "Your account is ready."
    sms:
      text: "Welcome {{name}}! Your account is ready."
EOF
    # Email through the simulator, in dev's order (provA, then provB); the credentials
    # are the dummy ones dev writes (switchboard::sim::route_config).
    local sim_base="http://127.0.0.1:$sim_port"
    cat >"$dir/providers.json" <<EOF
{"providers": {"email": [
  {"provider": "prova", "config": {"base_url": "$sim_base/prova", "api_key": "sim_prova_api_key", "default_from": "noreply@sim.switchboard.test"}},
  {"provider": "provb", "config": {"base_url": "$sim_base/provb", "api_key": "sim_provb_api_key", "default_from": "noreply@sim.switchboard.test"}}
]}}
EOF
    local sbc=("$SB" --config "$cfg")
    local op_log=$OUT/production-setup.log
    : >"$op_log"
    op() { timeout 120 env SWITCHBOARD_LOG=warn NO_COLOR=1 "${sbc[@]}" "$@" 2>>"$op_log"; }
    log "production: migrations, workspace $ws with a live and a test key, webhook secrets, workflow, email route"
    op migrate >>"$op_log" || die "migrate failed (see $op_log)"
    op keys create --workspace "$ws" --mode live --tier paid >"$dir/live.key" || die "keys create failed (see $op_log)"
    op keys create --workspace "$ws" --mode test --tier paid >"$dir/test.key" || die "keys create failed (see $op_log)"
    for slug in prova provb provc provd prove; do
        # Provider-wide, as dev sets them; `-` reads the secret from stdin (not in ps).
        op webhooks set-secret --provider "$slug" - <<<"${secret[$slug]}" >>"$op_log" ||
            die "webhooks set-secret $slug failed (see $op_log)"
    done
    op workflows apply "$dir/welcome.yaml" --workspace "$ws" >>"$op_log" || die "workflows apply failed (see $op_log)"
    op providers apply "$dir/providers.json" --workspace "$ws" >>"$op_log" || die "providers apply failed (see $op_log)"

    log "production: starting switchboard serve on 127.0.0.1:$GW_PORT (streams ${STREAMS[*]})"
    STREAMS_MAY_EXIST=1
    env SWITCHBOARD_LOG=warn NO_COLOR=1 "${sbc[@]}" serve --drain-seconds 0 >"$OUT/production-gateway.log" 2>&1 &
    GATEWAY_PID=$!
    { wait_for "$OUT/production-gateway.log" "listening on" "$GATEWAY_PID" 300 &&
        wait_http "http://127.0.0.1:$GW_PORT/v1/health" "$GATEWAY_PID" 30 &&
        wait_http "http://127.0.0.1:$met_port/metrics" "$GATEWAY_PID" 30; } ||
        {
            tail -20 "$OUT/production-gateway.log" >&2
            die "switchboard serve did not start (or one of its ports was taken meanwhile)"
        }
    log "production: starting switchboard sim on 127.0.0.1:$sim_port"
    env SWITCHBOARD_LOG=warn NO_COLOR=1 "${sbc[@]}" sim >"$OUT/production-sim.log" 2>&1 &
    SIM_PID=$!
    { wait_for "$OUT/production-sim.log" "provider simulator on" "$SIM_PID" 60 &&
        wait_http "$sim_base/_sim/stats" "$SIM_PID" 30; } ||
        {
            tail -20 "$OUT/production-sim.log" >&2
            die "switchboard sim did not start"
        }

    local common=(--sim-url "$sim_base" --metrics-url "http://127.0.0.1:$met_port"
        --gateway-pid "$GATEWAY_PID" --watch "gateway=$GATEWAY_PID" --watch "simulator=$SIM_PID"
        --pg-db "$DB")
    if run_variant production live "$EVENTS" "$dir/live.key" "${common[@]}"; then
        if ((TEST_EVENTS == 0)) || run_variant production test "$TEST_EVENTS" "$dir/test.key" "${common[@]}"; then
            ((ENDPOINT_EVENTS == 0)) ||
                run_variant production live+endpoint "$ENDPOINT_EVENTS" "$dir/live.key" "${common[@]}" || true
        fi
    fi
    kill -0 "$GATEWAY_PID" 2>/dev/null || die "switchboard serve died (see $OUT/production-gateway.log)"
    kill -0 "$SIM_PID" 2>/dev/null || die "switchboard sim died (see $OUT/production-sim.log)"
    pq() { timeout 60 psql "$PG_URL_BASE/$DB" -tA -v ON_ERROR_STOP=1 -c "$1"; }
    db_checks production pq
    log "production: stopping sim and serve, deleting the run's streams"
    stop_pid "$SIM_PID"
    SIM_PID=""
    stop_pid "$GATEWAY_PID"
    GATEWAY_PID=""
    delete_streams
}

for set in $SETS; do
    "run_$set"
done

# ---------------------------------------------------------------- summary
mib() { awk -v k="${1:-0}" 'BEGIN { if (k == "" || k == "null") print "n/a"; else printf "%.1f", k / 1024 }'; }
row() { # set mode
    local f=$OUT/$1-$2.json
    [[ -f $f ]] || return 0
    jq -r --arg set "$1" --arg mode "$2" '
      def n: if . == null then "n/a" else tostring end;
      "| \($set) | \($mode) | \(.accepted) | \(.accepted_per_s | n) | \(.sent_per_s | n) | **\(.delivered_per_s | n)** | \(.trigger_to_delivered_ms.p50 | n) | \(.trigger_to_delivered_ms.p99 | n) | \(.trigger_to_sent_ms.p50 | n) / \(.trigger_to_sent_ms.p99 | n) | \(.memory.gateway_vmhwm_kb // 0 | . / 1024 * 10 | round / 10) | \(if .ok then "yes" else "**NO**" end) |"' "$f"
}
detail() { # set mode
    local f=$OUT/$1-$2.json
    [[ -f $f ]] || return 0
    jq -r --arg set "$1" --arg mode "$2" '
      def groups: .cpu.groups | to_entries | sort_by(-.value.cores) | map("\(.key) \(.value.cores)") | join(", ");
      def per_message: .cpu.groups | to_entries | map(select(.value.us_per_message != null and .value.us_per_message >= 1)) | sort_by(-.value.us_per_message) | map("\(.key) \(.value.us_per_message)") | join(", ");
      def target: if $mode == "test" then 8000 else 3000 end;
      def unseen: if .cpu.machine.busy_cores then (.cpu.machine.busy_cores - ([.cpu.groups[].cores] | add) | . * 1000 | round / 1000) else "n/a" end;
      "- **\($set), \($mode) key**: \(.accepted) accepted in \(.bulk_requests | length) bulk requests (\(.bulk_requests | map("\(.latency_ms) ms") | join(", ")))"
      + (if .complete then "; last SENT \(.last_sent_after_t0_s) s and last DELIVERED \(.last_delivered_after_t0_s) s after the first request."
         + "\n  - Checked by reading every message back: statuses \(.verified.statuses | tostring), timelines \(.verified.timeline_shapes | tostring), providers \(.verified.providers | tostring), attempts \(.verified.attempts | tostring), \(.verified.distinct_provider_message_ids) distinct provider message ids."
         else "; **not every message reached a final status in time** (pending event ids in bench/out/delivery/\($set)-\($mode).json, `never_final`)." end)
      + (if .simulator then "\n  - Simulator counters over the run: \(.simulator.sends_accepted) sends accepted, \(.simulator.duplicate_sends) duplicate sends, \(.simulator.callbacks_ok) callbacks accepted by the gateway, \(.simulator.callbacks_failed) failed." else "" end)
      + (if .trigger_to_callback_received_ms then "\n  - Trigger to the callback reaching the gateway (timeline `delivered`): p50 \(.trigger_to_callback_received_ms.p50) ms, p99 \(.trigger_to_callback_received_ms.p99) ms." else "" end)
      + (if .memory.watched_vmhwm_kb.simulator then "\n  - Simulator process peak RSS (VmHWM): \(.memory.watched_vmhwm_kb.simulator / 1024 * 10 | round / 10) MiB; gateway VmRSS sampled every 0.5 s peaked at \((.memory.gateway_vmrss_max_sampled_kb // 0) / 1024 * 10 | round / 10) MiB." else "\n  - Gateway VmRSS sampled every 0.5 s peaked at \((.memory.gateway_vmrss_max_sampled_kb // 0) / 1024 * 10 | round / 10) MiB (the simulator runs inside it)." end)
      + "\n  - CPU from the first request until every message was final (or the deadline) (\(.cpu.window_s) s, in cores of \(.cpu.cpus)): \(groups); whole machine busy \(.cpu.machine.busy_cores // "n/a") cores, of which \(unseen) not attributed (processes that started and ended inside the window, e.g. compilers)."
      + (if .cpu.machine.busy_us_per_message then "\n  - CPU per accepted message, µs: \(per_message); the whole machine \(.cpu.machine.busy_us_per_message) (on \(.cpu.cpus) cores, the target of \(target) deliveries/s leaves \(.cpu.cpus * 1000000 / target | round) µs each)." else "" end)
      + (if .pipeline.stages then "\n  - Where a delivery'"'"'s time went (the gateway'"'"'s `/metrics`, over the run): mean per stage \(.pipeline.stages | to_entries | map("\(.key) \(.value.mean_ms) ms") | join(", ")); the store'"'"'s \(.pipeline.store_lanes) write lane(s) ran \(.pipeline.store_batches_per_s) batches/s of \(.pipeline.store_writes_per_batch) writes, busy \(.pipeline.store_lane_busy_share | to_entries | map("\(.key) \(.value * 100 | round) %") | join(", ")) of the time." else "" end)
      + (if (.pipeline.endpoint_attempts // {}) | length > 0 then "\n  - Tries at the webhook endpoint by outcome (`deferred`: handed back, not a try): \(.pipeline.endpoint_attempts | to_entries | map("\(.key) \(.value)") | join(", "))." else "" end)
      + (if .endpoint then "\n  - Webhook endpoint (a local receiver, told of message.sent and message.delivered): \(.endpoint.distinct_events) events (\(.endpoint.by_type | tostring)), \(.endpoint.repeated_requests) repeated requests, last \(.endpoint.last_event_after_t0_s) s after the first request: **\(.endpoint.events_per_s) events/s**; trigger to message.delivered received p50 \(.endpoint.trigger_to_delivered_event_ms.p50) ms, p99 \(.endpoint.trigger_to_delivered_event_ms.p99) ms; \(.endpoint.messages_with_delivered_event) of \(.accepted) messages had their message.delivered." else "" end)
      + (if (.problems | length) > 0 then "\n  - **Problems**: \(.problems | join("; "))" else "" end)' "$f"
}
log_line() { # set
    local f g w e
    for f in "$OUT/$1-gateway.log" "$OUT/$1-sim.log"; do
        [[ -f $f ]] || continue
        w=$(grep -c 'WARN' "$f" || true)
        e=$(grep -cE 'ERROR|panicked' "$f" || true)
        g+="${g:+; }$(basename "$f" .log): $w WARN, $e ERROR/panic"
    done
    [[ -z ${g:-} ]] || printf -- '- **%s logs** (SWITCHBOARD_LOG=warn): %s\n' "$1" "$g"
    if [[ $1 == production && -f $OUT/streams-cleanup.json ]]; then
        jq -r '"- **production streams**: messages left before deletion (work-queue retention: 0 means all acknowledged): \(.messages | to_entries | map("\(.key) \(.value)") | join(", ")); deleted \(.deleted | length) of 4"' "$OUT/streams-cleanup.json"
    fi
}
db_line() { # set
    [[ -f $OUT/$1-db.txt ]] || return 0
    printf -- '- **%s store** after both runs: %s\n' "$1" "$(awk 'BEGIN { ORS = "" } /:$/ { if (n++) print "; "; print $0 " "; next } { gsub(/\|/, " "); print "[" $0 "] " }' "$OUT/$1-db.txt")"
}
CPU_MODEL=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)
GIT_REV="$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- host 2>/dev/null || echo ' (host/ has uncommitted changes)')"
[[ -n $BIN_DIR ]] && GIT_REV+=" (binaries from $BIN_DIR, not necessarily this commit's)"
SUMMARY=$(
    cat <<EOF
Command: \`$COMMAND_LINE\`
Run: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs ($CPU_MODEL), git $GIT_REV, release build.
Settings: $EVENTS live events, $TEST_EVENTS test-key events and $ENDPOINT_EVENTS live events with a webhook endpoint per backend set, \`welcome\` workflow, email, bulk requests of $BULK, one distinct subscriber per event; simulator callback delay ${CALLBACK_DELAY_MS:-300 (default)} ms; deadline $DEADLINE s, stall limit $STALL s. Embedded: \`switchboard dev\` (SQLite, embedded queue, in-memory counters, simulator in the same process). Production: \`switchboard serve\` on PostgreSQL 15 + NATS JetStream + Redis with \`switchboard sim\` as its own process. Everything shares the same $(nproc) cores.

| backend set | key | events | accepted/s | sent/s | delivered/s | trigger→DELIVERED p50 ms | p99 ms | trigger→sent p50 / p99 ms | gateway peak RSS MiB | verified |
| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |
$(for set in $SETS; do row "$set" live; row "$set" test; row "$set" live+endpoint; done)

$(for set in $SETS; do detail "$set" live; detail "$set" test; detail "$set" live+endpoint; done)
$(for set in $SETS; do db_line "$set"; log_line "$set"; done)
EOF
)
printf '\n%s\n' "$SUMMARY"

if ((${#FAILURES[@]} > 0)); then
    log "not appended to bench/results.md: checks failed in ${FAILURES[*]} (reports in $OUT)"
    exit 1
fi
RESULTS=$ROOT/bench/results.md
grep -q '^# Delivery$' "$RESULTS" 2>/dev/null || cat >>"$RESULTS" <<'EOF'

# Delivery

End-to-end delivery runs (`bash bench/delivery.sh`, method in bench/README.md), newest last.
Rates count from the first bulk request; latencies are from each message's own
timestamps; "verified" means every message was read back DELIVERED with one `sent` and
one `delivered` timeline entry, and the simulator saw exactly one send per live message.
EOF
printf '\n## Delivery run %s\n\n%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$SUMMARY" >>"$RESULTS"
log "appended to bench/results.md (raw reports in bench/out/delivery/)"
