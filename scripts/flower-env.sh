# Source this file (". scripts/flower-env.sh") before `flwr run .` in this project.
# Flower's CLI starts its local SuperLink by name (so the venv's bin/ must be on PATH) and,
# unless told otherwise, phones home, checks for updates and re-installs every project
# dependency into a fresh venv for each run (slow, and fatal offline). This turns that off
# and keeps Flower's state in the project (.flwr/, git-ignored).
#
# Ports: `flwr run .` sends the run to whatever SuperLink answers on 127.0.0.1:39091
# (Flower's default, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT), whatever its FLWR_HOME: another
# project's or another user's. This project's local SuperLink gets its own pair instead,
# derived from FLWR_HOME (the CRC of its absolute path): HTTP API 20000 + 2 * (crc % 5000),
# Control API the next port. The same checkout always gets the same ports, another
# checkout or FLWR_HOME (almost always) others.
#
# A value you exported yourself wins (FLWR_HOME, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT,
# FLWR_LOCAL_CONTROL_API_PORT); a value this file exported earlier in the same shell,
# for this or another checkout, is replaced (FEDUL_FLWR_ENV remembers what it set).
_fedul_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
if [ -d "$_fedul_root/.venv/bin" ]; then
  case ":$PATH:" in *":$_fedul_root/.venv/bin:"*) ;; *) export PATH="$_fedul_root/.venv/bin:$PATH" ;; esac
fi
# _fedul_set NAME VALUE: export NAME=VALUE unless NAME holds a value this file did not set
_fedul_set() {
  eval "_fedul_now=\"\${$1:-}\""
  if [ -n "$_fedul_now" ]; then
    case " ${FEDUL_FLWR_ENV:-} " in
      *" $1=$_fedul_now "*) ;;  # set by this file earlier (this or another checkout): replace it
      *) return 0 ;;            # yours: keep it
    esac
  fi
  export "$1=$2"
  _fedul_mine="$_fedul_mine $1=$2"
}
_fedul_mine=""
_fedul_set FLWR_HOME "$_fedul_root/.flwr"
_fedul_crc="$(printf '%s' "$FLWR_HOME" | cksum | cut -d' ' -f1)"
_fedul_port=$((20000 + 2 * (_fedul_crc % 5000)))
_fedul_set FLWR_LOCAL_SUPERLINK_HTTP_API_PORT "$_fedul_port"
_fedul_set FLWR_LOCAL_CONTROL_API_PORT "$((_fedul_port + 1))"
export FEDUL_FLWR_ENV="${_fedul_mine# }"
export FLWR_TELEMETRY_ENABLED=0
export FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
unset _fedul_root _fedul_crc _fedul_port _fedul_now _fedul_mine
unset -f _fedul_set
