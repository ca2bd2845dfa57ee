#!/usr/bin/env bash
# Stop this project's local SuperLink, and no other: the one `flwr run .` started in the
# background with this project's FLWR_HOME (scripts/flower-env.sh sets <repository>/.flwr).
# Flower starts it with `--log-file $FLWR_HOME/local-superlink/superlink.log`; the process
# whose command line is `flower-superlink ... --log-file <that file>` is it. It is stopped by
# its PID (SIGTERM to it and to the processes of its own group, the runs it started; SIGKILL
# after 10 s). SuperLinks of other users, other projects or other FLWR_HOMEs keep running.
#
# Usage: scripts/stop_superlink.sh [--flwr-home DIR] [--dry-run]
#   --flwr-home DIR   the FLWR_HOME whose SuperLink to stop (default: $FLWR_HOME, else
#                     <repository>/.flwr as scripts/flower-env.sh sets it)
#   --dry-run         print the PID(s) it would stop, stop nothing
# Exit code 0 also when no such SuperLink runs (it says so).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOME_DIR="${FLWR_HOME:-$REPO/.flwr}"
DRY=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --flwr-home) HOME_DIR="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
done
LOG="$(realpath -m "$HOME_DIR/local-superlink/superlink.log")"

alive() {  # alive PID: the process exists and is not a zombie
  local state
  state="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" || return 1
  [[ -n "$state" && "$state" != Z ]]
}

PIDS=()
for proc in /proc/[0-9]*; do
  pid="${proc#/proc/}"
  [[ "$pid" == "$$" ]] && continue
  args=()
  mapfile -d '' args 2>/dev/null < "$proc/cmdline" || continue  # (2> first: the process may be gone)
  is_link=0
  for ((i = 0; i < ${#args[@]}; i++)); do
    [[ "$(basename -- "${args[i]}")" == flower-superlink ]] && is_link=1
    if ((is_link)) && [[ "${args[i]}" == --log-file ]] && ((i + 1 < ${#args[@]})) \
        && [[ "$(realpath -m -- "${args[i + 1]}")" == "$LOG" ]]; then
      PIDS+=("$pid")
      break
    fi
  done
done

if [[ ${#PIDS[@]} -eq 0 ]]; then
  echo "no SuperLink of FLWR_HOME=$HOME_DIR is running (looked for --log-file $LOG)"
  exit 0
fi
for pid in "${PIDS[@]}"; do
  pgid="$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" || continue
  target="$pid"
  [[ "$pgid" == "$pid" ]] && target="-$pid"  # it leads its own group (Flower detaches it): the group too
  if ((DRY)); then
    echo "would stop SuperLink $pid (FLWR_HOME=$HOME_DIR)"
    continue
  fi
  kill -TERM -- "$target" 2>/dev/null || true
  for _ in $(seq 1 20); do
    alive "$pid" || break
    sleep 0.5
  done
  if alive "$pid"; then
    kill -KILL -- "$target" 2>/dev/null || true
  fi
  echo "stopped SuperLink $pid (FLWR_HOME=$HOME_DIR)"
done
