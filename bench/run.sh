#!/usr/bin/env bash
# Switchboard ingestion benchmark: the gateway (`switchboard serve` on PostgreSQL,
# NATS JetStream and Redis) against a bare axum handler, same load generator, same
# settings, same run. See bench/README.md.
#
# Settings (environment variables, defaults in brackets):
#   DURATION [10]        measured seconds per load run
#   WARMUP [3]           warm-up seconds before each measured window
#   CONCURRENCY [128]    requests in flight (closed loop)
#   KEYS [300]           API keys, each in its own paid workspace (100 req/s each)
#   SUBSCRIBERS [200000] subscriber ids cycled over (20 events/s cap each)
#   BULK [5000]          events per bulk request
#   BULK_REPEAT [5]      bulk requests sent
#   LOADGEN_THREADS []   tokio threads of the load generator (default: all CPUs)
#   SKIP_BUILD [0]       1: use the existing target/release binaries
#   KEEP_DB [0]          1: keep the benchmark database afterwards
#   BUILD_TIMEOUT [5400] seconds the release build may take (cargo may wait on a lock)
#   PG_URL_BASE [postgres://postgres@127.0.0.1:5432]  NATS_URL [nats://127.0.0.1:4222]
#   REDIS_URL [redis://127.0.0.1:6379]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

DURATION=${DURATION:-10}
WARMUP=${WARMUP:-3}
CONCURRENCY=${CONCURRENCY:-128}
KEYS=${KEYS:-300}
SUBSCRIBERS=${SUBSCRIBERS:-200000}
BULK=${BULK:-5000}
BULK_REPEAT=${BULK_REPEAT:-5}
LOADGEN_THREADS=${LOADGEN_THREADS:-}
SKIP_BUILD=${SKIP_BUILD:-0}
KEEP_DB=${KEEP_DB:-0}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-5400}
PG_URL_BASE=${PG_URL_BASE:-postgres://postgres@127.0.0.1:5432}
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}

# The exact command line, with every setting that was overridden.
OVERRIDES=""
for v in DURATION WARMUP CONCURRENCY KEYS SUBSCRIBERS BULK BULK_REPEAT LOADGEN_THREADS \
    SKIP_BUILD KEEP_DB BUILD_TIMEOUT PG_URL_BASE NATS_URL REDIS_URL; do
    if printenv "$v" >/dev/null 2>&1; then OVERRIDES+="$v=$(printenv "$v") "; fi
done
COMMAND_LINE="${OVERRIDES}bash bench/run.sh${*:+ $*}"

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

for tool in jq psql shuf timeout awk; do
    command -v "$tool" >/dev/null || die "$tool is required"
done
for n in DURATION WARMUP CONCURRENCY KEYS SUBSCRIBERS BULK BULK_REPEAT BUILD_TIMEOUT; do
    [[ ${!n} =~ ^[0-9]+$ ]] || die "$n must be a whole number, got '${!n}'"
done
((KEYS >= 1 && KEYS <= 2000)) || die "KEYS must be 1 to 2000"
((DURATION >= 1 && DURATION <= 600)) || die "DURATION must be 1 to 600"

RUN_ID="$(date +%Y%m%d%H%M%S)_$$"
DB="sb_bench_${RUN_ID}"
STREAM_CRITICAL="SBBENCH_${RUN_ID}_CRITICAL"
STREAM_BULK="SBBENCH_${RUN_ID}_BULK"
SUBJECT_PREFIX="sbbench_${RUN_ID}"
COUNTER_PREFIX="sbbench:${RUN_ID}:"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sb-bench.XXXXXX")
OUT="$ROOT/bench/out"
mkdir -p "$OUT"
SB="$ROOT/target/release/switchboard"
LOADGEN="$ROOT/target/release/loadgen"
BASELINE="$ROOT/target/release/baseline"

GATEWAY_PID=""
BASELINE_PID=""
CHILD_PID=""
SAMPLER_PID=""
DB_CREATED=""
GATEWAY_STARTED=""

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

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_pid "$CHILD_PID"
    stop_pid "$SAMPLER_PID"
    stop_pid "$BASELINE_PID"
    stop_pid "$GATEWAY_PID"
    if [[ -n $GATEWAY_STARTED && -x $LOADGEN ]]; then
        timeout 30 "$LOADGEN" --cleanup --nats-url "$NATS_URL" \
            --stream "$STREAM_CRITICAL" --stream "$STREAM_BULK" >"$WORK/cleanup.json" 2>>"$WORK/cleanup.err" ||
            log "could not delete streams $STREAM_CRITICAL/$STREAM_BULK (see $OUT/cleanup.err)"
        cp -f "$WORK/cleanup.json" "$WORK/cleanup.err" "$OUT/" 2>/dev/null
    fi
    if [[ -n $DB_CREATED && $KEEP_DB != 1 ]]; then
        timeout 30 psql "$PG_URL_BASE/postgres" -q -v ON_ERROR_STOP=1 \
            -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 ||
            log "could not drop database $DB"
    fi
    # Redis keys of the run expire on their own (1 s windows, short TTLs).
    for f in gateway.log keys.err; do
        [[ -f $WORK/$f ]] && cp -f "$WORK/$f" "$OUT/$f"
    done
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# run_child, free_port, wait_for.
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

# CPU time (user + system) of PID in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
TICKS=$(getconf CLK_TCK 2>/dev/null || echo 100)

rss_kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null || true; }

# Highest VmRSS seen, written to FILE, every 0.2 s while PID lives (at most 10 min).
sample_rss() {
    local pid=$1 file=$2 max=0 v i
    for i in $(seq 1 3000); do
        kill -0 "$pid" 2>/dev/null || break
        v=$(rss_kb "$pid" VmRSS)
        if [[ -n $v ]] && ((v > max)); then
            max=$v
            echo "$max" >"$file"
        fi
        sleep 0.2
    done
}

# ---------------------------------------------------------------- build
if [[ $SKIP_BUILD != 1 ]]; then
    log "building release binaries (may wait for other builds' cargo lock; bounded by ${BUILD_TIMEOUT}s)"
    run_child "$BUILD_TIMEOUT" - cargo build --release -p switchboard -p switchboard-bench ||
        die "release build failed or timed out"
fi
for b in "$SB" "$LOADGEN" "$BASELINE"; do
    [[ -x $b ]] || die "$b is missing (build first, or unset SKIP_BUILD)"
done

# ---------------------------------------------------------------- database
log "creating database $DB"
timeout 30 psql "$PG_URL_BASE/postgres" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $DB" >/dev/null ||
    die "cannot create database $DB"
DB_CREATED=1

GW_PORT=$(free_port) || die "no free port"
SB_ENV=(
    "SWITCHBOARD_LISTEN=127.0.0.1:$GW_PORT"
    "SWITCHBOARD_STORE__URL=$PG_URL_BASE/$DB"
    "SWITCHBOARD_BROKER__URL=$NATS_URL"
    "SWITCHBOARD_BROKER__STREAMS__CRITICAL=$STREAM_CRITICAL"
    "SWITCHBOARD_BROKER__STREAMS__BULK=$STREAM_BULK"
    "SWITCHBOARD_BROKER__STREAMS__SUBJECT_PREFIX=$SUBJECT_PREFIX"
    "SWITCHBOARD_COUNTERS__URL=$REDIS_URL"
    "SWITCHBOARD_COUNTERS__KEY_PREFIX=$COUNTER_PREFIX"
    "SWITCHBOARD_DATA_DIR=$WORK/data"
    "SWITCHBOARD_LOG=warn"
)
mkdir -p "$WORK/data"

# ---------------------------------------------------------------- gateway
log "starting switchboard serve on 127.0.0.1:$GW_PORT (streams $STREAM_CRITICAL, $STREAM_BULK)"
GATEWAY_STARTED=1
env "${SB_ENV[@]}" "$SB" serve --drain-seconds 0 >"$WORK/gateway.log" 2>&1 &
GATEWAY_PID=$!
wait_for "$WORK/gateway.log" "listening on" "$GATEWAY_PID" 120 ||
    { tail -20 "$WORK/gateway.log" >&2; die "gateway did not start"; }
log "gateway up (pid $GATEWAY_PID)"

log "creating $KEYS live keys in $KEYS paid workspaces"
: >"$WORK/keys.txt"
started=$(date +%s)
for i in $(seq 1 "$KEYS"); do
    timeout 30 env "${SB_ENV[@]}" "$SB" keys create --workspace "bench-$RUN_ID-$i" \
        --mode live --tier paid >>"$WORK/keys.txt" 2>>"$WORK/keys.err" ||
        die "keys create failed for workspace bench-$RUN_ID-$i (see $OUT/keys.err)"
done
got=$(grep -c . "$WORK/keys.txt" || true)
[[ $got == "$KEYS" ]] || die "expected $KEYS keys, got $got"
log "keys created in $(($(date +%s) - started)) s"

RSS_IDLE=$(rss_kb "$GATEWAY_PID" VmRSS)

LG=("$LOADGEN" --concurrency "$CONCURRENCY" --duration "$DURATION" --warmup "$WARMUP"
    --subscribers "$SUBSCRIBERS")
[[ -n $LOADGEN_THREADS ]] && LG+=(--threads "$LOADGEN_THREADS")
LOAD_TIMEOUT=$((WARMUP + DURATION + 60))

GW_CMD=("${LG[@]}" --url "http://127.0.0.1:$GW_PORT" --path /v1/events/trigger
    --keys-file "$WORK/keys.txt" --label gateway)
log "load on the gateway: ${GW_CMD[*]#$ROOT/}"
sample_rss "$GATEWAY_PID" "$WORK/rss_load_max" &
SAMPLER_PID=$!
CPU_BEFORE=$(cpu_ticks "$GATEWAY_PID")
run_child "$LOAD_TIMEOUT" "$OUT/gateway.json" "${GW_CMD[@]}" || die "loadgen against the gateway failed"
CPU_AFTER=$(cpu_ticks "$GATEWAY_PID")
stop_pid "$SAMPLER_PID"
SAMPLER_PID=""
RSS_LOAD_MAX=$(cat "$WORK/rss_load_max" 2>/dev/null || echo 0)
RSS_AFTER_LOAD=$(rss_kb "$GATEWAY_PID" VmRSS)
kill -0 "$GATEWAY_PID" 2>/dev/null || die "the gateway died under load (see $OUT/gateway.log)"

BULK_CMD=("$LOADGEN" --url "http://127.0.0.1:$GW_PORT" --keys-file "$WORK/keys.txt"
    --bulk "$BULK" --repeat "$BULK_REPEAT" --label gateway-bulk)
log "bulk on the gateway: ${BULK_CMD[*]#$ROOT/}"
sample_rss "$GATEWAY_PID" "$WORK/rss_bulk_max" &
SAMPLER_PID=$!
run_child $((BULK_REPEAT * 130 + 10)) "$OUT/bulk.json" "${BULK_CMD[@]}" || die "bulk loadgen failed"
stop_pid "$SAMPLER_PID"
SAMPLER_PID=""
RSS_BULK_MAX=$(cat "$WORK/rss_bulk_max" 2>/dev/null || echo 0)
kill -0 "$GATEWAY_PID" 2>/dev/null || die "the gateway died during bulk (see $OUT/gateway.log)"
RSS_HWM=$(rss_kb "$GATEWAY_PID" VmHWM)
RSS_END=$(rss_kb "$GATEWAY_PID" VmRSS)

DB_MESSAGES=$(timeout 30 psql "$PG_URL_BASE/$DB" -tA -c "SELECT count(*) FROM messages" 2>/dev/null || echo "?")
DB_OUTBOX=$(timeout 30 psql "$PG_URL_BASE/$DB" -tA -c "SELECT count(*) FROM outbox" 2>/dev/null || echo "?")

log "stopping the gateway"
stop_pid "$GATEWAY_PID"
GATEWAY_PID=""
if timeout 30 "$LOADGEN" --cleanup --nats-url "$NATS_URL" --stream "$STREAM_CRITICAL" \
    --stream "$STREAM_BULK" >"$OUT/cleanup.json" 2>"$WORK/cleanup.err" &&
    [[ $(jq '.deleted | length' "$OUT/cleanup.json") == 2 ]]; then
    GATEWAY_STARTED="" # streams gone: nothing left for the trap to delete
else
    log "stream cleanup failed (the exit trap retries): $(cat "$WORK/cleanup.err" "$OUT/cleanup.json" 2>/dev/null)"
fi
STREAM_MESSAGES=$(jq '[.messages[]?] | add // 0' "$OUT/cleanup.json" 2>/dev/null || echo "?")
GW_LOG_LINES=$(grep -v 'listening on' "$WORK/gateway.log" | grep -c . || true)
GW_LOG_ERRORS=$(grep -cE 'ERROR|panicked' "$WORK/gateway.log" || true)
GW_LOG_WARNS=$(grep -c 'WARN' "$WORK/gateway.log" || true)

# ---------------------------------------------------------------- baseline
BASE_PORT=$(free_port) || die "no free port"
log "starting the baseline on 127.0.0.1:$BASE_PORT"
"$BASELINE" --listen "127.0.0.1:$BASE_PORT" >"$WORK/baseline.log" 2>&1 &
BASELINE_PID=$!
wait_for "$WORK/baseline.log" "listening on" "$BASELINE_PID" 30 ||
    { cat "$WORK/baseline.log" >&2; die "baseline did not start"; }
BASE_CMD=("${LG[@]}" --url "http://127.0.0.1:$BASE_PORT" --path /v1/events/trigger
    --keys-file "$WORK/keys.txt" --label baseline)
log "load on the baseline: ${BASE_CMD[*]#$ROOT/}"
BASE_CPU_BEFORE=$(cpu_ticks "$BASELINE_PID")
run_child "$LOAD_TIMEOUT" "$OUT/baseline.json" "${BASE_CMD[@]}" || die "loadgen against the baseline failed"
BASE_CPU_AFTER=$(cpu_ticks "$BASELINE_PID")
BASE_HWM=$(rss_kb "$BASELINE_PID" VmHWM)
stop_pid "$BASELINE_PID"
BASELINE_PID=""

# ---------------------------------------------------------------- summary
mib() { awk -v k="${1:-0}" 'BEGIN { printf "%.1f", k / 1024 }'; }
g() { jq -r "$1" "$OUT/gateway.json"; }
b() { jq -r "$1" "$OUT/baseline.json"; }
GW_TPS=$(g .throughput_ok_per_s)
BASE_TPS=$(b .throughput_ok_per_s)
RATIO=$(awk -v a="$GW_TPS" -v b="$BASE_TPS" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }')
BULK_MEDIAN=$(jq -r '.median_ms // "n/a"' "$OUT/bulk.json")
BULK_RUNS=$(jq -r '[.runs[] | if .http_status then "\(.latency_ms) ms (HTTP \(.http_status), \(.queued // "?") queued, \(.failed // "?") failed)" else "\(.error) after \(.latency_ms) ms" end] | join("; ")' "$OUT/bulk.json")
# Server CPU over the whole load run (warm-up included), per request answered in it.
cpu_line() { # ticks_before ticks_after report
    local answered
    answered=$(jq '.requests + .warmup.requests + .answered_after_window' "$3")
    awk -v t=$(($2 - $1)) -v hz="$TICKS" -v n="$answered" -v secs=$((WARMUP + DURATION)) 'BEGIN {
        c = t / hz
        printf "%.1f CPU-s over ~%d s (%.2f cores), %.0f µs CPU per request", c, secs, c / secs, (n > 0 ? c * 1e6 / n : 0)
    }'
}
GW_CPU=$(cpu_line "$CPU_BEFORE" "$CPU_AFTER" "$OUT/gateway.json")
BASE_CPU=$(cpu_line "$BASE_CPU_BEFORE" "$BASE_CPU_AFTER" "$OUT/baseline.json")
CPU_MODEL=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)

row() { # label file
    jq -r --arg l "$1" '"| \($l) | \(.throughput_ok_per_s) | \(.latency_ms.p50 // "n/a") | \(.latency_ms.p90 // "n/a") | \(.latency_ms.p99 // "n/a") | \(.latency_ms.max // "n/a") | \(.requests) | \(.ok) | \(.rate_limited_429) | \(.server_errors_5xx) | \(.transport_errors) |"' "$2"
}

SUMMARY=$(
    cat <<EOF
# Switchboard ingestion benchmark

Command: \`$COMMAND_LINE\`
Run: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs ($CPU_MODEL), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- host 2>/dev/null || echo ' (host/ has uncommitted changes)').
Settings: concurrency $CONCURRENCY, warm-up ${WARMUP} s, measured ${DURATION} s, $KEYS keys in $KEYS paid workspaces, $SUBSCRIBERS subscribers, bulk $BULK events x $BULK_REPEAT.
Gateway: \`switchboard serve --drain-seconds 0\` on PostgreSQL + NATS JetStream + Redis (all local), release build. The load generator, the gateway and its three backends share the same $(nproc) cores.

## POST /v1/events/trigger (closed loop)

| target | triggers/s (2xx) | p50 ms | p90 ms | p99 ms | max ms | requests | 2xx | 429 | 5xx | transport errors |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
$(row gateway "$OUT/gateway.json")
$(row "bare axum baseline" "$OUT/baseline.json")

- Gateway / baseline throughput: **$RATIO**
- Gateway status counts: $(g '.status | to_entries | map("\(.key): \(.value)") | join(", ")'); warm-up: $(g '.warmup.status | to_entries | map("\(.key): \(.value)") | join(", ")')
- Server process CPU during the load (PostgreSQL, NATS, Redis and the load generator not included): gateway $GW_CPU; baseline $BASE_CPU
- Non-2xx samples from the gateway: $(g 'if (.non_2xx_samples | length) == 0 then "none" else (.non_2xx_samples | map("\(.status) \(.body)") | join(" / ")) end')

## POST /v1/events/bulk ($BULK events, one key, distinct subscribers)

- Median latency: **$BULK_MEDIAN ms** over $BULK_REPEAT requests
- Each: $BULK_RUNS

## Gateway memory (/proc/<pid>/status)

| measure | MiB |
| --- | ---: |
| VmRSS idle, after start and key creation | $(mib "$RSS_IDLE") |
| VmRSS max sampled during trigger load (every 0.2 s) | $(mib "$RSS_LOAD_MAX") |
| VmRSS right after trigger load | $(mib "$RSS_AFTER_LOAD") |
| VmRSS max sampled during bulk | $(mib "$RSS_BULK_MAX") |
| **VmHWM (peak RSS since start)** | **$(mib "$RSS_HWM")** |
| VmRSS at the end | $(mib "$RSS_END") |
| baseline VmHWM, for comparison | $(mib "$BASE_HWM") |

## Cross-checks

- Rows in \`messages\`: $DB_MESSAGES (every 2xx trigger, warm-up and post-window answers included, plus queued bulk events); rows left in \`outbox\`: $DB_OUTBOX
- Messages in the run's two JetStream streams before deletion: $STREAM_MESSAGES
- Gateway log (SWITCHBOARD_LOG=warn), start-up banner excluded: $GW_LOG_LINES lines, $GW_LOG_WARNS WARN, $GW_LOG_ERRORS ERROR/panic

Raw reports: bench/out/gateway.json, bench/out/baseline.json, bench/out/bulk.json, bench/out/cleanup.json, bench/out/gateway.log (not committed).

Commands run (paths relative to the repository; \`\$KEYS_FILE\` is a temporary file of the run's keys):

\`\`\`
$(echo "${GW_CMD[*]}" | sed "s#$ROOT/##g; s#$WORK/keys.txt#\$KEYS_FILE#g")
$(echo "${BULK_CMD[*]}" | sed "s#$ROOT/##g; s#$WORK/keys.txt#\$KEYS_FILE#g")
$(echo "${BASE_CMD[*]}" | sed "s#$ROOT/##g; s#$WORK/keys.txt#\$KEYS_FILE#g")
\`\`\`
EOF
)
# bench/delivery.sh appends its runs under "# Delivery": keep that section.
DELIVERY_SECTION=$(sed -n '/^# Delivery$/,$p' "$ROOT/bench/results.md" 2>/dev/null || true)
printf '%s\n' "$SUMMARY" >"$ROOT/bench/results.md"
[[ -z $DELIVERY_SECTION ]] || printf '\n%s\n' "$DELIVERY_SECTION" >>"$ROOT/bench/results.md"
printf '%s\n' "$SUMMARY"
log "summary written to bench/results.md"
