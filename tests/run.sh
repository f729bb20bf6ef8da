#!/usr/bin/env bash
# The README's test command: installs everything the tests need (idempotent, cached) and
# runs lint, types and the whole test suite. Usage: bash tests/run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${KUBETRAIN_VENV:-$ROOT/.venv}

step() { printf '\n== %s\n' "$*"; }
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

step "python environment ($VENV)"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# strict editable mode: a link tree mypy can read; the folders map to kubetrain.operator
# and kubetrain.trainer (the stdlib owns the bare name `operator`).
"$VENV/bin/python" -m pip install -q -e ".[dev]" --config-settings editable_mode=strict
export PATH="$VENV/bin:$PATH"

if ! command -v shellcheck >/dev/null 2>&1; then
  step "shellcheck (Debian package, for the e2e script's lint test)"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq shellcheck
fi

if [ -f tests/cluster/install.sh ]; then
  step "control plane binaries (cached under ${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain)"
  bash tests/cluster/install.sh
fi

step "images from the Dockerfile (buildah, cached by content; KUBETRAIN_SKIP_IMAGES=1 skips)"
$SUDO env "XDG_CACHE_HOME=${XDG_CACHE_HOME:-$HOME/.cache}" "KUBETRAIN_VENV=$VENV" \
  "KUBETRAIN_SKIP_IMAGES=${KUBETRAIN_SKIP_IMAGES:-}" bash tests/cluster/build-images.sh

step "ruff"
ruff check .
ruff format --check .

step "mypy"
mypy

step "pytest"
exec python -m pytest "$@"
