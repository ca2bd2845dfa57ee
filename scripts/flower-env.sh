# Source this file (". scripts/flower-env.sh") before `flwr run .` in this project.
# Flower's CLI starts its local SuperLink by name (so the venv's bin/ must be on PATH) and,
# unless told otherwise, phones home, checks for updates and re-installs every project
# dependency into a fresh venv for each run (slow, and fatal offline). This turns that off
# and keeps Flower's state in the project (.flwr/, git-ignored).
_fedul_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
if [ -d "$_fedul_root/.venv/bin" ]; then
  case ":$PATH:" in *":$_fedul_root/.venv/bin:"*) ;; *) export PATH="$_fedul_root/.venv/bin:$PATH" ;; esac
fi
export FLWR_HOME="${FLWR_HOME:-$_fedul_root/.flwr}"
export FLWR_TELEMETRY_ENABLED=0
export FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
unset _fedul_root
