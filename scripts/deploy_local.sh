#!/usr/bin/env bash
# A real Flower deployment of fedul-flwr on this machine (loopback): one SuperLink, N
# SuperNodes, each with its own data folder, and one `flwr run` -- the same processes and
# flags as on separate machines, only with 127.0.0.1 addresses and without TLS.
#
# Usage: scripts/deploy_local.sh [options]
#   --nodes N            number of SuperNodes (default 3)
#   --port P             SuperLink port (default 9500); SuperNode i uses P+1+i for its
#                        local runtime API
#   --workdir DIR        where node data, FLWR_HOME, logs and run outputs go
#                        (default: a new folder under /tmp)
#   --data-root DIR      use existing node folders DIR/node-0 .. DIR/node-<N-1> instead of
#                        writing simulated ones (see `fedul node-data write --help`)
#   --max-set-size K     images per U set of the simulated nodes (default 20)
#   --run-config "..."   extra run settings for `flwr run`, e.g. "num-rounds=3 lr=0.0005"
#                        (default "num-rounds=2"); a key given here replaces the script's
#                        own: min-available-nodes=N min-train-nodes=N (every round needs all
#                        N nodes), device="cpu", output-dir="<workdir>/runs". A run that goes
#                        on when a node dies: "min-available-nodes=2 min-train-nodes=2"
#   --timeout S          give up after S seconds of run time (default 600)
#   --tls                TLS on every connection and SuperNode authentication: makes a CA,
#                        a server certificate and N+1 SuperNode key pairs
#                        (scripts/make_certs.sh), registers the keys of nodes 0..N-1 with
#                        the SuperLink, and also starts a SuperNode with the unregistered
#                        key, which must be refused (intruder.log)
#
# Prints the run id and its final status; exits 0 only if the run finished as completed.
# Leaves in the workdir: superlink.log, supernode-<i>.log, run.log (`flwr log` of the run),
# status.json (`flwr ls --format json`), runs/<run folder> (metrics, model.pt).
# Every process it starts is stopped at exit (each runs in its own process group, so the
# SuperExec/ClientApp processes a SuperNode spawns are stopped with it).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_BIN="${VENV_BIN:-$REPO/.venv/bin}"
NODES=3
PORT=9500
WORKDIR=""
DATA_ROOT=""
MAX_SET_SIZE=20
RUN_CONFIG="num-rounds=2"
TIMEOUT=600
CONNECTION="fedul-local"
TLS=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --workdir) WORKDIR="$2"; shift 2 ;;
    --data-root) DATA_ROOT="$2"; shift 2 ;;
    --max-set-size) MAX_SET_SIZE="$2"; shift 2 ;;
    --run-config) RUN_CONFIG="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --tls) TLS=1; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
done

WORKDIR="${WORKDIR:-$(mktemp -d /tmp/fedul-deploy.XXXXXX)}"
mkdir -p "$WORKDIR"
WORKDIR="$(cd "$WORKDIR" && pwd)"
export PATH="$VENV_BIN:$PATH"
export FLWR_HOME="$WORKDIR/flwr-home"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
mkdir -p "$FLWR_HOME"

PGIDS=()
cleanup() {  # TERM every process group, wait up to 10 s, then KILL what is left
  local pg alive
  for pg in "${PGIDS[@]}"; do kill -TERM -- "-$pg" 2>/dev/null || true; done
  for _ in $(seq 1 20); do
    alive=0
    for pg in "${PGIDS[@]}"; do ps -o stat= --sid "$pg" 2>/dev/null | grep -qv "^Z" && alive=1; done
    [[ $alive == 0 ]] && return 0
    sleep 0.5
  done
  for pg in "${PGIDS[@]}"; do kill -KILL -- "-$pg" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

start() {  # start LOGFILE CMD...: run CMD in its own session (process group); remember it
  local log="$1"; shift
  setsid "$@" >"$log" 2>&1 < /dev/null &
  PGIDS+=("$!")
}

# 1. node data: one folder per SuperNode
if [[ -z "$DATA_ROOT" ]]; then
  DATA_ROOT="$WORKDIR/nodes"
  echo "writing $NODES simulated node folders to $DATA_ROOT"
  fedul node-data write --out "$DATA_ROOT" --num-nodes "$NODES" --max-set-size "$MAX_SET_SIZE" > "$WORKDIR/node-data.txt"
fi
for ((i = 0; i < NODES; i++)); do
  fedul node-data validate "$DATA_ROOT/node-$i" > /dev/null
done

# 2. SuperLink (Fleet, Control and runtime APIs on one port) and a connection for the CLI
CERTS="$WORKDIR/certs"
if [[ $TLS == 1 ]]; then
  "$REPO/scripts/make_certs.sh" --out "$CERTS" --nodes "$((NODES + 1))" > /dev/null
  LINK_SECURITY=(--ssl-ca-certfile "$CERTS/ca.crt" --ssl-certfile "$CERTS/server.pem" --ssl-keyfile "$CERTS/server.key"
                 --enable-supernode-auth)
  CONN_SECURITY="root-certificates = \"$CERTS/ca.crt\""
  HEALTH=(curl -sf --cacert "$CERTS/ca.crt" "https://127.0.0.1:$PORT/health")
else
  LINK_SECURITY=(--insecure)
  CONN_SECURITY="insecure = true"
  HEALTH=(curl -sf "http://127.0.0.1:$PORT/health")
fi
start "$WORKDIR/superlink.log" flower-superlink "${LINK_SECURITY[@]}" --disable-runtime-dependency-installation \
  --host 127.0.0.1 --port "$PORT"
for _ in $(seq 1 60); do
  "${HEALTH[@]}" > /dev/null 2>&1 && break
  sleep 0.5
done
"${HEALTH[@]}" > /dev/null || { echo "SuperLink did not come up; see $WORKDIR/superlink.log" >&2; exit 1; }
cat > "$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "$CONNECTION"

[superlink.$CONNECTION]
address = "127.0.0.1:$PORT"
$CONN_SECURITY
EOF

# 3. SuperNodes, each with its own data folder (and, with --tls, its own registered key)
node_security() {  # node_security I: the security flags of SuperNode I
  if [[ $TLS == 1 ]]; then
    echo --root-certificates "$CERTS/ca.crt" --auth-supernode-private-key "$CERTS/supernode-$1"
  else
    echo --insecure
  fi
}
for ((i = 0; i < NODES; i++)); do
  if [[ $TLS == 1 ]]; then
    flwr supernode register "$CERTS/supernode-$i.pub" "$CONNECTION" > /dev/null
  fi
  # shellcheck disable=SC2046  # word splitting wanted: flags and paths without spaces
  start "$WORKDIR/supernode-$i.log" flower-supernode $(node_security "$i") --superlink "127.0.0.1:$PORT" \
    --port "$((PORT + 1 + i))" --node-config "data-dir=\"$DATA_ROOT/node-$i\""
done
if [[ $TLS == 1 ]]; then  # a SuperNode whose key was never registered must be refused
  # shellcheck disable=SC2046
  if timeout 120 flower-supernode $(node_security "$NODES") --superlink "127.0.0.1:$PORT" \
      --port "$((PORT + 1 + NODES))" --node-config "data-dir=\"$DATA_ROOT/node-0\"" \
      > "$WORKDIR/intruder.log" 2>&1 < /dev/null; then
    echo "a SuperNode with an unregistered key was not refused; see $WORKDIR/intruder.log" >&2; exit 1
  fi
  grep -q "Failed to activate SuperNode" "$WORKDIR/intruder.log" \
    || { echo "unexpected outcome of the unregistered SuperNode; see $WORKDIR/intruder.log" >&2; exit 1; }
  echo "a SuperNode with an unregistered key was refused (see $WORKDIR/intruder.log)"
fi

# 4. submit the run (by default all N nodes take part in every round); the settings are
# checked first, since Flower refuses an unknown key without naming it. A key of --run-config
# replaces the default (Flower refuses a key given twice)
cd "$REPO"
SETTINGS="$RUN_CONFIG"
for setting in "min-available-nodes=$NODES" "min-train-nodes=$NODES" 'device="cpu"' "output-dir=\"$WORKDIR/runs\""; do
  [[ " $RUN_CONFIG" =~ [[:space:]]${setting%%=*}= ]] || SETTINGS="$setting $SETTINGS"
done
fedul check --no-simulation --run-config "$SETTINGS" > /dev/null
SUBMIT="$(flwr run . "$CONNECTION" --format json --run-config "$SETTINGS")"
RUN_ID="$(python -c 'import json,sys; print(json.load(sys.stdin)["run-id"])' <<< "$SUBMIT")"
echo "run $RUN_ID submitted; logs in $WORKDIR"

# 5. wait for the run to finish: `flwr log --stream` follows the run's log until it ends
# (one process; polling `flwr ls` would start a Python process every few seconds), then
# `flwr ls` gives the status (the stream also ends early if the connection drops: ask again)
STATUS=""
DEADLINE=$((SECONDS + TIMEOUT))
while ((SECONDS < DEADLINE)); do
  timeout "$((DEADLINE - SECONDS))" flwr log "$RUN_ID" "$CONNECTION" --stream > "$WORKDIR/run.log" 2>&1 || true
  flwr ls "$CONNECTION" --run-id "$RUN_ID" --format json > "$WORKDIR/status.json" 2>/dev/null || true
  STATUS="$(python -c 'import json,sys; print(json.load(sys.stdin)["runs"][0]["status"])' < "$WORKDIR/status.json" 2>/dev/null || true)"
  [[ "$STATUS" == finished:* ]] && break
  sleep 5
done
echo "run $RUN_ID: ${STATUS:-unknown}"
grep -E "aggregate_train|Received error" "$WORKDIR/run.log" || true
[[ "$STATUS" == "finished:completed" ]]
