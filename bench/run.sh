#!/usr/bin/env bash
# Side-by-side benchmark of vkgate and other OpenAI-compatible proxies against a fixed,
# near-free upstream (an nginx mock), all measured in the same run on this machine, so every
# figure can be read as a ratio. Loopback only; every load step is bounded in time; stops
# exactly the processes it started (by PID) on any exit, Ctrl-C included.
#
#   bash bench/run.sh                                   # full pass (~6 min on 2 cores)
#   DUR=3s CONCS="1 16" SEQ_N=100 bash bench/run.sh     # quick check
#
# Targets, in order: nginx mock direct (the limit) -> bare Python forwarder with each
# BARE_WORKERS uvicorn workers (the ceiling of any Python proxy) -> vkgate with each
# VKGATE_WORKERS proxy workers (control plane + seeded organization, governed key: auth
# cache, rate limits, budget reservation, spend record) ->
# LiteLLM with each LITELLM_WORKERS -> Portkey gateway -> EXTRA_TARGET. Each: a sanity
# request, 2 s warm-up, wrk at each of CONCS, one streaming run at STREAM_CONC, SEQ_N
# sequential requests. Then the tables (bench/peers/table.py).
#
# Knobs (env):
#   DUR=10s  CONCS="1 16 64"  STREAM_CONC=16 (empty: no streaming runs)  SEQ_N=500
#   RESPONSES_CONC=16         the Responses API passed through, direct and vkgate (empty: none)
#   WRK_THREADS=1             wrk threads (1 leaves the CPU to the proxy)
#   WITH_BARE=1               the bare forwarder (0: skip)
#   BARE_WORKERS="1 2"        its uvicorn worker counts (1: bare-forwarder, N: bare-forwarder-wN)
#   VKGATE_WORKERS="1 2"      vkgate proxy worker counts (empty: skip vkgate)
#   WITH_CACHED=1             vkgate also on a governed key whose answers the response cache
#                             serves (row vkgate-wN-cached: every request after the first is a
#                             hit, no provider call); 0: skip
#   WITH_CLOUD=1              vkgate also through a bedrock and a gemini credential on the mock
#                             (rows vkgate-wN-bedrock, vkgate-wN-gemini: chat translated, Bedrock
#                             signed; no stream run for bedrock, whose event stream nginx cannot
#                             return); 0: skip
#   VKGATE_BENCH_PROXY_ENV="NAME=VALUE ..."   extra settings for the vkgate proxy
#   READY_TIMEOUT=90          seconds vkgate's control plane + seed + proxy may take to start
#   WITH_LITELLM=auto|0|1     LITELLM_WORKERS="1" (e.g. "1 2")   LITELLM_VENV=/tmp/litellm-venv
#   WITH_PORTKEY=auto|0|1     PORTKEY_DIR=/tmp/portkey
#   MOCK_PORT=18080  LITELLM_PORT=4000  PORTKEY_PORT=8787
#   VKGATE_VENV=<repo>/.venv  RESULTS_DIR=$TMPDIR/bench-results
#   EXTRA_TARGET="name|base_url|pid|key|stream_model"  a proxy already running (pid for CPU
#     accounting) whose providers point at the mock: http://127.0.0.1:$MOCK_PORT/v1 for chat
#     and http://127.0.0.1:$MOCK_PORT/stream/v1 behind the alias named stream_model.
# Install the tools first: bash bench/peers/setup.sh
set -uo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PEERS="$BENCH_DIR/peers"
REPO_ROOT="$(dirname "$BENCH_DIR")"
VKGATE_VENV="${VKGATE_VENV:-$REPO_ROOT/.venv}"
DUR="${DUR:-10s}"
CONCS="${CONCS:-1 16 64}"
STREAM_CONC="${STREAM_CONC-16}"
RESPONSES_CONC="${RESPONSES_CONC-16}"
SEQ_N="${SEQ_N:-500}"
WRK_THREADS="${WRK_THREADS:-1}"
WITH_BARE="${WITH_BARE:-1}"
BARE_WORKERS="${BARE_WORKERS:-1 2}"
VKGATE_WORKERS="${VKGATE_WORKERS-1 2}"
WITH_CLOUD="${WITH_CLOUD:-1}"
WITH_CACHED="${WITH_CACHED:-1}"
READY_TIMEOUT="${READY_TIMEOUT:-90}"
WITH_LITELLM="${WITH_LITELLM:-auto}"
LITELLM_WORKERS="${LITELLM_WORKERS:-1}"
LITELLM_VENV="${LITELLM_VENV:-/tmp/litellm-venv}"
WITH_PORTKEY="${WITH_PORTKEY:-auto}"
PORTKEY_DIR="${PORTKEY_DIR:-/tmp/portkey}"
RESULTS_DIR="${RESULTS_DIR:-${TMPDIR:-/tmp}/bench-results}"
HOST=127.0.0.1
MOCK_PORT="${MOCK_PORT:-18080}"
LITELLM_PORT="${LITELLM_PORT:-4000}"
PORTKEY_PORT="${PORTKEY_PORT:-8787}"
MASTER_KEY=sk-bench-master-key            # LiteLLM general_settings.master_key
UPSTREAM_KEY=sk-dummy-upstream-key        # what the mock "expects"; never checked
RUN_ID="$(date +%Y%m%d-%H%M%S)"
DUR_S="${DUR%s}"
CLK_TCK="$(getconf CLK_TCK)"

[[ "$DUR" =~ ^[0-9]+s$ ]] || { echo "DUR must be whole seconds, e.g. DUR=10s" >&2; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-run-$RUN_ID-XXXX")" || exit 1   # logs + raw output
ROWS="$WORK/rows.tsv"
mkdir -p "$WORK/nginx/logs" "$WORK/nginx/tmp" "$RESULTS_DIR"
: > "$ROWS"
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---------------------------------------------------------------- processes
STARTED=()          # PIDs this script started (nginx master included)
NGINX_PID=""
LOAD_PID=""         # the load step running now (timeout + wrk or the sequential client)

descendants() {     # all descendant PIDs of $1, depth first
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done
}

alive_any() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }

stop_pid() {        # stop one started process tree, by PID only
  # LiteLLM --num_workers>1 forks: the PID we started exits at once on TERM and leaves its
  # uvicorn supervisor (+ workers) behind, which needs a few seconds to shut down. vkgate's
  # target script stops its proxy and control plane itself (up to 15 s each). So: signal the
  # PID, then TERM whatever of the tree (listed before signalling) is left, give it 20 s,
  # then KILL.
  local pid="$1" sig="${2:-TERM}" kids k
  kill -0 "$pid" 2>/dev/null || return 0
  kids="$(descendants "$pid")"
  kill -"$sig" "$pid" 2>/dev/null
  for _ in $(seq 1 160); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  for k in $kids "$pid"; do kill -0 "$k" 2>/dev/null && kill -TERM "$k" 2>/dev/null; done
  # shellcheck disable=SC2086  # $kids is a list of PIDs
  for _ in $(seq 1 80); do alive_any $kids "$pid" || break; sleep 0.25; done
  for k in $kids "$pid"; do kill -0 "$k" 2>/dev/null && { log "SIGKILL $k"; kill -KILL "$k" 2>/dev/null; }; done
  wait "$pid" 2>/dev/null
  return 0
}

cleanup() {
  local p
  if [[ -n "$LOAD_PID" ]]; then stop_pid "$LOAD_PID" TERM; LOAD_PID=""; fi
  for p in "${STARTED[@]}"; do
    if [[ "$p" == "$NGINX_PID" ]]; then stop_pid "$p" QUIT; else stop_pid "$p" TERM; fi
  done
  STARTED=()
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP

forget_pid() { local p keep=(); for p in "${STARTED[@]}"; do [[ "$p" != "$1" ]] && keep+=("$p"); done; STARTED=("${keep[@]}"); }

port_free() { [[ -z "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]]; }

free_port() {       # a port the kernel hands out now on 127.0.0.1
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_http() {       # wait_http URL SECONDS PID -> 0 when it answers 200
  local url="$1" secs="$2" pid="$3" _
  for _ in $(seq 1 $((secs * 4))); do
    kill -0 "$pid" 2>/dev/null || return 1
    [[ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$url")" == 200 ]] && return 0
    sleep 0.25
  done
  return 1
}

cpu_ticks() {       # utime+stime of a PID tree, in clock ticks
  local pid="$1" p sum=0 f
  for p in "$pid" $(descendants "$pid"); do
    f="$(cat "/proc/$p/stat" 2>/dev/null)" || continue
    f="${f##*) }"                   # drop "pid (comm) "; fields now start at #3
    # shellcheck disable=SC2086
    set -- $f
    sum=$((sum + ${12} + ${13}))    # fields 14, 15 of the full line
  done
  echo "$sum"
}

cpu_pct() {         # cpu_pct TICKS0 TICKS1 NS0 NS1 -> % of one core
  echo $(( ($2 - $1) * 100 * 1000000000 / CLK_TCK / ($4 - $3) ))
}

machine_ticks() {   # "STEAL TOTAL" of every CPU so far, in clock ticks (/proc/stat)
  local _ user nice system idle iowait irq softirq steal
  read -r _ user nice system idle iowait irq softirq steal _ < /proc/stat
  echo "$steal $((user + nice + system + idle + iowait + irq + softirq + steal))"
}

steal_pct() {       # steal_pct "STEAL0 TOTAL0" "STEAL1 TOTAL1" -> % of the machine's CPU time
  local s0 t0 s1 t1                 # the hypervisor gave to others: noise no target caused
  read -r s0 t0 <<< "$1"; read -r s1 t1 <<< "$2"
  local permille=0
  (( t1 > t0 )) && permille=$(( (s1 - s0) * 1000 / (t1 - t0) ))
  echo "$((permille / 10)).$((permille % 10))"
}

bounded() {         # bounded SECONDS OUT CMD...: run in the background, wait (Ctrl-C stops it)
  local secs="$1" out="$2"; shift 2
  timeout -k 5 "$secs" "$@" > "$out" 2>&1 &
  LOAD_PID=$!
  wait "$LOAD_PID"
  LOAD_PID=""
}

# ---------------------------------------------------------------- measuring
# check_chat URL [curl args...]: one POST, must return a chat.completion w/ usage
check_chat() {
  local url="$1"; shift
  curl -s -m 10 -X POST "$url" -H 'Content-Type: application/json' "$@" \
    -d '{"model":"gpt-4o-mini","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"ping"}]}' \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["object"]=="chat.completion" and d["usage"]["total_tokens"]>0, d' 2>"$WORK/check.err"
}

add_row() {         # target mode conc BENCH_RESULT-line cpu% aux-cpu% steal%
  local target="$1" mode="$2" conc="$3" line="$4" cpu="$5" aux="${6:-}" steal="${7:-}" kv rps="" p50="" p99="" non2xx=0 sockerr=0 req=0
  for kv in $line; do
    case "$kv" in
      rps=*) rps="${kv#*=}" ;; p50_ms=*) p50="${kv#*=}" ;; p99_ms=*) p99="${kv#*=}" ;;
      non2xx=*) non2xx="${kv#*=}" ;; sockerr=*) sockerr="${kv#*=}" ;; requests=*) req="${kv#*=}" ;;
    esac
  done
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
    "$target" "$mode" "$conc" "${rps:-nan}" "${p50:-nan}" "${p99:-nan}" "$req" "$non2xx" "$sockerr" "$cpu" "$aux" "$steal" >> "$ROWS"
}

# measured TARGET MODE CONC WATCH_PID OUT CMD...: run a load step, record its row with the CPU
# of WATCH_PID's tree (and of AUX_PID's tree when set: vkgate's control plane).
measured() {
  local target="$1" mode="$2" conc="$3" watch="$4" out="$5"; shift 5
  local c0 c1 a0=0 a1=0 t0 t1 m0 m1 cpu aux="" steal line secs
  secs=$((DUR_S + 30)); [[ "$mode" == seq ]] && secs=180
  c0=$(cpu_ticks "$watch"); [[ -n "${AUX_PID:-}" ]] && a0=$(cpu_ticks "$AUX_PID"); t0=$(date +%s%N)
  m0=$(machine_ticks)
  bounded "$secs" "$out" "$@"
  m1=$(machine_ticks)
  c1=$(cpu_ticks "$watch"); [[ -n "${AUX_PID:-}" ]] && a1=$(cpu_ticks "$AUX_PID"); t1=$(date +%s%N)
  cpu=$(cpu_pct "$c0" "$c1" "$t0" "$t1")
  [[ -n "${AUX_PID:-}" ]] && aux=$(cpu_pct "$a0" "$a1" "$t0" "$t1")
  steal=$(steal_pct "$m0" "$m1")
  line="$(grep '^BENCH_RESULT' "$out" | tail -1)"
  [[ -z "$line" ]] && log "$target $mode c=$conc: no result, see $out"
  add_row "$target" "$mode" "$conc" "$line" "$cpu" "$aux" "$steal"
  log "$target $mode c=$conc: ${line#BENCH_RESULT } cpu=${cpu}%${aux:+ control-plane=${aux}%} steal=${steal}%"
}

# run_wrk TARGET URL CONC STREAM(0|1) WATCH_PID [KEY] [HEADERS]
run_wrk() {
  local target="$1" url="$2" conc="$3" stream="$4" watch="$5" key="${6:-}" hdrs="${7:-}"
  local t=$WRK_THREADS mode=chat
  (( t > conc )) && t=$conc
  [[ "$stream" == 1 ]] && mode=stream
  BENCH_API_KEY="$key" BENCH_HEADERS="$hdrs" BENCH_STREAM="$stream" \
    measured "$target" "$mode" "$conc" "$watch" "$WORK/wrk-$target-$mode-c$conc.txt" \
    wrk -t"$t" -c"$conc" -d"$DUR" --timeout 10s --latency -s "$PEERS/chat.lua" "$url"
}

warmup() {          # warmup URL KEY HEADERS: short unrecorded load
  BENCH_API_KEY="$2" BENCH_HEADERS="$3" bounded 20 /dev/null \
    wrk -t1 -c16 -d2s --timeout 10s -s "$PEERS/chat.lua" "$1"
}

# run_responses TARGET BASE_URL WATCH_PID KEY: `POST /v1/responses` at RESPONSES_CONC, after a
# sanity request (vkgate passes it through to the mock's /v1/responses; no peer serves it here)
run_responses() {
  local target="$1" base="$2" watch="$3" key="$4" conc="$RESPONSES_CONC" t=$WRK_THREADS
  [[ -n "$conc" ]] || return 0
  (( t > conc )) && t=$conc
  if ! curl -s -m 10 -X POST "$base/v1/responses" -H 'Content-Type: application/json' \
      -H "Authorization: Bearer $key" -d '{"model":"gpt-4o-mini","input":"ping"}' \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["object"]=="response" and d["usage"]["total_tokens"]>0, d' 2>"$WORK/check.err"; then
    log "$target: responses sanity check FAILED: $(head -c 300 "$WORK/check.err")"
    return 1
  fi
  BENCH_API_KEY="$key" BENCH_API=responses \
    measured "$target" responses "$conc" "$watch" "$WORK/wrk-$target-responses-c$conc.txt" \
    wrk -t"$t" -c"$conc" -d"$DUR" --timeout 10s --latency -s "$PEERS/chat.lua" "$base/v1/responses"
}

# run_seq TARGET URL WATCH_PID [KEY] [HEADER...]
run_seq() {
  local target="$1" url="$2" watch="$3" key="${4:-}"; shift 4 2>/dev/null || shift $#
  local args=() h
  for h in "$@"; do [[ -n "$h" ]] && args+=(--header "$h"); done
  BENCH_API_KEY="$key" measured "$target" seq 1 "$watch" "$WORK/seq-$target.txt" \
    python3 "$PEERS/seq_latency.py" --url "$url" --n "$SEQ_N" --max-seconds 150 "${args[@]}"
}

# run_target TARGET BASE_URL PID [KEY] [HEADERS(|-sep)] [STREAM_HEADERS]
# env: STREAM_MODEL (the alias routed to the mock's SSE path), AUX_PID (extra CPU column)
run_target() {
  local target="$1" base="$2" pid="$3" key="${4:-}" hdrs="${5:-}" shdrs="${6:-}" c
  local harr=() curl_h=() h
  IFS='|' read -r -a harr <<< "$hdrs"
  [[ -n "$key" ]] && curl_h+=(-H "Authorization: Bearer $key")
  for h in "${harr[@]}"; do [[ -n "$h" ]] && curl_h+=(-H "$h"); done
  if ! check_chat "$base/v1/chat/completions" "${curl_h[@]}"; then
    log "$target: sanity check FAILED: $(head -c 300 "$WORK/check.err")"
    add_row "$target" chat - "" -1
    return 1
  fi
  warmup "$base/v1/chat/completions" "$key" "$hdrs"
  for c in $CONCS; do run_wrk "$target" "$base/v1/chat/completions" "$c" 0 "$pid" "$key" "$hdrs"; done
  if [[ -n "$STREAM_CONC" ]]; then
    if [[ "$target" == direct* ]]; then
      run_wrk "$target" "$base/stream/v1/chat/completions" "$STREAM_CONC" 1 "$pid" "$key" "$hdrs"
    else
      BENCH_MODEL="${STREAM_MODEL:-gpt-4o-mini}" run_wrk "$target" "$base/v1/chat/completions" "$STREAM_CONC" 1 "$pid" "$key" "${shdrs:-$hdrs}"
    fi
  fi
  run_seq "$target" "$base/v1/chat/completions" "$pid" "$key" "${harr[@]}"
}

not_run() { add_row "$1" chat - "" -1; }

# ---------------------------------------------------------------- checks
for tool in nginx wrk curl python3 ss pgrep timeout; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run bench/peers/setup.sh" >&2; exit 1; }
done
PK_MAIN="$PORTKEY_DIR/node_modules/@portkey-ai/gateway/build/start-server.js"
use_litellm=0; use_portkey=0
[[ "$WITH_LITELLM" == 1 || ( "$WITH_LITELLM" == auto && -x "$LITELLM_VENV/bin/litellm" ) ]] && use_litellm=1
[[ "$WITH_PORTKEY" == 1 || ( "$WITH_PORTKEY" == auto && -f "$PK_MAIN" ) ]] && use_portkey=1
ports=("$MOCK_PORT")
[[ $use_litellm == 1 && -n "$LITELLM_WORKERS" ]] && ports+=("$LITELLM_PORT")
[[ $use_portkey == 1 ]] && ports+=("$PORTKEY_PORT")
for p in "${ports[@]}"; do
  port_free "$p" || { echo "port $p is already in use; not touching whatever holds it (see MOCK_PORT, LITELLM_PORT, PORTKEY_PORT)" >&2; exit 1; }
done

shown_env() {        # VKGATE_BENCH_PROXY_ENV for the header, secrets masked
  local item name value out=()
  for item in ${VKGATE_BENCH_PROXY_ENV:-}; do
    name="${item%%=*}" value="${item#*=}"
    case "$name" in
      *SECRET* | *KEY* | *TOKEN* | *PASSWORD* | *PEPPER*) value="***" ;;
      *) [[ "$value" == *://*@* ]] && value="${value%%://*}://***@${value#*@}" ;;
    esac
    out+=("$name=$value")
  done
  echo "${out[*]}"
}

{
  echo "# run $RUN_ID on $(hostname) | $(nproc) cores | load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $(nginx -v 2>&1) | $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2) | python $(python3 -V 2>&1 | cut -d' ' -f2)"
  if [[ -x "$VKGATE_VENV/bin/python" ]]; then
    echo "# vkgate $(git -C "$REPO_ROOT" describe --always --dirty 2>/dev/null || echo '?') on python $("$VKGATE_VENV/bin/python" -c 'import platform; print(platform.python_version())') | uvicorn $("$VKGATE_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("uvicorn"))' 2>/dev/null)${VKGATE_BENCH_PROXY_ENV:+ | proxy env: $(shown_env)}"
  fi
  [[ $use_litellm == 1 ]] && echo "# litellm $("$LITELLM_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))' 2>/dev/null)"
  [[ $use_portkey == 1 ]] && \
    echo "# portkey gateway $(node -p "require('$PORTKEY_DIR/node_modules/@portkey-ai/gateway/package.json').version") on node $(node -v)"
  echo "# wrk -t$WRK_THREADS -d$DUR --latency; seq = $SEQ_N sequential keep-alive requests (stdlib client)"
} > "$WORK/header.txt"
cat "$WORK/header.txt" >&2

# ---------------------------------------------------------------- nginx mock
MOCK="http://$HOST:$MOCK_PORT"
sed "s/127\.0\.0\.1:18080/$HOST:$MOCK_PORT/g" "$PEERS/nginx-mock.conf" > "$WORK/nginx-mock.conf"
sed "s/127\.0\.0\.1:18080/$HOST:$MOCK_PORT/g" "$PEERS/litellm-config.yaml" > "$WORK/litellm-config.yaml"
nginx -t -q -p "$WORK/nginx/" -e "$WORK/nginx/logs/error.log" -c "$WORK/nginx-mock.conf" || exit 1
nginx -p "$WORK/nginx/" -e "$WORK/nginx/logs/error.log" -c "$WORK/nginx-mock.conf" || exit 1
for _ in $(seq 1 40); do [[ -s "$WORK/nginx/nginx.pid" ]] && break; sleep 0.1; done
NGINX_PID="$(cat "$WORK/nginx/nginx.pid")"; STARTED+=("$NGINX_PID")
log "nginx mock up on $MOCK, master pid $NGINX_PID"
curl -sf -o /dev/null "$MOCK/healthz" || { log "nginx mock not answering"; exit 1; }

log "direct: wrk against the mock (physical limit of this harness)"
run_target direct-nginx "$MOCK" "$NGINX_PID" "$UPSTREAM_KEY"
run_responses direct-nginx "$MOCK" "$NGINX_PID" "$UPSTREAM_KEY"

# ---------------------------------------------------------------- bare forwarder
if [[ "$WITH_BARE" == 1 ]]; then
  for w in $BARE_WORKERS; do
    target=bare-forwarder; (( w > 1 )) && target="bare-forwarder-w$w"
    if [[ ! -x "$VKGATE_VENV/bin/uvicorn" ]]; then
      log "no uvicorn in $VKGATE_VENV (set VKGATE_VENV); $target skipped"; not_run "$target"; continue
    fi
    BARE_PORT="$(free_port)"
    log "$target: uvicorn ($w worker(s), uvloop, httptools) on $HOST:$BARE_PORT"
    UPSTREAM="$MOCK" "$VKGATE_VENV/bin/uvicorn" --app-dir "$PEERS" --host "$HOST" --port "$BARE_PORT" \
      --workers "$w" --loop uvloop --http httptools --no-access-log --log-level warning \
      bare_forwarder:app > "$WORK/$target.log" 2>&1 &
    BPID=$!; STARTED+=("$BPID")
    # No health route: any HTTP answer (405 for a GET) means it listens.
    for _ in $(seq 1 80); do
      kill -0 "$BPID" 2>/dev/null || break
      [[ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://$HOST:$BARE_PORT/")" != 000 ]] && break
      sleep 0.25
    done
    if kill -0 "$BPID" 2>/dev/null; then
      STREAM_MODEL=gpt-4o-mini-stream run_target "$target" "http://$HOST:$BARE_PORT" "$BPID" "$UPSTREAM_KEY"
    else
      log "$target did not start; tail of log:"; tail -20 "$WORK/$target.log" >&2
      not_run "$target"
    fi
    stop_pid "$BPID" TERM; forget_pid "$BPID"
  done
fi

# ---------------------------------------------------------------- vkgate
for w in $VKGATE_WORKERS; do
  target="vkgate-w$w"
  if [[ ! -x "$VKGATE_VENV/bin/python" ]]; then
    log "no python in $VKGATE_VENV (set VKGATE_VENV); $target skipped"; not_run "$target"; continue
  fi
  log "$target: starting control plane, seeding, proxy with $w worker(s)"
  vk_out="$WORK/$target.out"
  ( cd "$REPO_ROOT" && exec "$VKGATE_VENV/bin/python" "$PEERS/vkgate_target.py" --workers "$w" \
      --upstream "$MOCK" --work "$WORK" ) > "$vk_out" 2> "$WORK/$target.err" &
  VPID=$!; STARTED+=("$VPID")
  ready=""; t0=$(date +%s)
  while (( $(date +%s) - t0 < READY_TIMEOUT )); do
    ready="$(grep -m1 '^READY ' "$vk_out" 2>/dev/null)" && break
    kill -0 "$VPID" 2>/dev/null || break
    sleep 0.25
  done
  if [[ -n "$ready" ]]; then
    read -r _ VK_URL VK_PID VK_KEY VK_STREAM VK_CP_PID <<< "$ready"
    log "$target ready after $(( $(date +%s) - t0 ))s at $VK_URL (proxy pid $VK_PID, control plane pid $VK_CP_PID)"
    AUX_PID="$VK_CP_PID" STREAM_MODEL="$VK_STREAM" run_target "$target" "$VK_URL" "$VK_PID" "$VK_KEY"
    AUX_PID="$VK_CP_PID" run_responses "$target" "$VK_URL" "$VK_PID" "$VK_KEY"
    if [[ "$WITH_CACHED" == 1 ]]; then
      read -r _ VK_CACHED <<< "$(grep -m1 '^CACHED ' "$vk_out")"
      # The same proxy and routes; the key's answers come from the response cache.
      AUX_PID="$VK_CP_PID" STREAM_MODEL="$VK_STREAM" \
        run_target "$target-cached" "$VK_URL" "$VK_PID" "$VK_CACHED"
      unset VK_CACHED
    fi
    if [[ "$WITH_CLOUD" == 1 ]]; then
      read -r _ VK_BEDROCK VK_GEMINI <<< "$(grep -m1 '^CLOUD ' "$vk_out")"
      # The same proxy and aliases, the keys routing them to a bedrock / a gemini credential.
      AUX_PID="$VK_CP_PID" STREAM_CONC="" \
        run_target "$target-bedrock" "$VK_URL" "$VK_PID" "$VK_BEDROCK"
      AUX_PID="$VK_CP_PID" STREAM_MODEL="$VK_STREAM" \
        run_target "$target-gemini" "$VK_URL" "$VK_PID" "$VK_GEMINI"
      unset VK_BEDROCK VK_GEMINI
    fi
  else
    if kill -0 "$VPID" 2>/dev/null; then
      log "$target did not become ready in ${READY_TIMEOUT}s; tail of its output:"
    else
      log "$target exited before it was ready; tail of its output:"
    fi
    tail -20 "$WORK/$target.err" >&2
    for f in "$WORK"/vkgate-w"$w"-*/*.log; do [[ -f "$f" ]] && { log "$f:"; tail -10 "$f" >&2; }; done
    not_run "$target"
  fi
  stop_pid "$VPID" TERM; forget_pid "$VPID"
  unset VK_KEY
done

# ---------------------------------------------------------------- LiteLLM
if [[ $use_litellm == 1 ]]; then
  for w in $LITELLM_WORKERS; do
    if [[ ! -x "$LITELLM_VENV/bin/litellm" ]]; then
      log "LiteLLM not installed at $LITELLM_VENV (bench/peers/setup.sh)"; not_run "litellm-w$w"; continue
    fi
    log "LiteLLM: starting with --num_workers $w"
    env LITELLM_LOCAL_MODEL_COST_MAP=True \
        LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS=True LITELLM_LOCAL_AUTOROUTER_PRESETS=True \
        LITELLM_LOCAL_BLOG_POSTS=True LITELLM_LOCAL_POLICY_TEMPLATES=True \
        LITELLM_TELEMETRY_DISABLED=true LITELLM_LOG=ERROR \
        HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost \
        "$LITELLM_VENV/bin/litellm" --config "$WORK/litellm-config.yaml" \
        --host "$HOST" --port "$LITELLM_PORT" --num_workers "$w" \
        > "$WORK/litellm-w$w.log" 2>&1 &
    LPID=$!; STARTED+=("$LPID")
    t0=$(date +%s)
    if wait_http "http://$HOST:$LITELLM_PORT/health/liveliness" 180 "$LPID"; then
      log "LiteLLM w=$w ready after $(( $(date +%s) - t0 ))s (pid $LPID)"
      STREAM_MODEL=gpt-4o-mini-stream run_target "litellm-w$w" "http://$HOST:$LITELLM_PORT" "$LPID" "$MASTER_KEY"
    else
      log "LiteLLM w=$w did not come up; tail of log:"; tail -20 "$WORK/litellm-w$w.log" >&2
      not_run "litellm-w$w"
    fi
    stop_pid "$LPID" TERM; forget_pid "$LPID"
    for _ in $(seq 1 40); do port_free "$LITELLM_PORT" && break; sleep 0.25; done
  done
else
  log "LiteLLM skipped (WITH_LITELLM=$WITH_LITELLM, $LITELLM_VENV; install: bench/peers/setup.sh)"
fi

# ---------------------------------------------------------------- Portkey
if [[ $use_portkey == 1 ]]; then
  if [[ -f "$PK_MAIN" ]]; then
    log "Portkey: starting gateway on $HOST:$PORTKEY_PORT"
    ( cd "$PORTKEY_DIR" && NODE_ENV=production BENCH_BIND_HOST="$HOST" exec node \
        --import "$PEERS/loopback-only.mjs" "$PK_MAIN" --port="$PORTKEY_PORT" --headless ) \
        > "$WORK/portkey.log" 2>&1 &
    PK_PID=$!; STARTED+=("$PK_PID")
    if wait_http "http://$HOST:$PORTKEY_PORT/" 60 "$PK_PID"; then
      log "Portkey ready (pid $PK_PID)"
      run_target portkey "http://$HOST:$PORTKEY_PORT" "$PK_PID" "$UPSTREAM_KEY" \
        "x-portkey-provider: openai|x-portkey-custom-host: $MOCK/v1" \
        "x-portkey-provider: openai|x-portkey-custom-host: $MOCK/stream/v1"
    else
      log "Portkey did not come up; tail of log:"; tail -20 "$WORK/portkey.log" >&2
      not_run portkey
    fi
    stop_pid "$PK_PID" TERM; forget_pid "$PK_PID"
  else
    log "Portkey not installed at $PORTKEY_DIR (bench/peers/setup.sh)"; not_run portkey
  fi
else
  log "Portkey skipped (WITH_PORTKEY=$WITH_PORTKEY, $PORTKEY_DIR; install: bench/peers/setup.sh)"
fi

# ---------------------------------------------------------------- extra target
if [[ -n "${EXTRA_TARGET:-}" ]]; then
  IFS='|' read -r X_NAME X_URL X_PID X_KEY X_SMODEL <<< "$EXTRA_TARGET"
  log "$X_NAME: already running at $X_URL (pid $X_PID)"
  STREAM_MODEL="${X_SMODEL:-gpt-4o-mini}" run_target "$X_NAME" "$X_URL" "$X_PID" "$X_KEY"
fi

cleanup
trap - EXIT

# ---------------------------------------------------------------- tables
python3 "$PEERS/table.py" "$ROWS" "$WORK/header.txt" "$RESULTS_DIR/$RUN_ID"
log "raw output: $WORK ; tables saved to $RESULTS_DIR/$RUN_ID.txt"
failed="$(awk -F'\t' '$10 == -1 { print $1 }' "$ROWS" | sort -u | tr '\n' ' ')"
[[ -z "$failed" ]] || { log "not run: $failed(see above)"; exit 1; }
