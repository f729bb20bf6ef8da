#!/usr/bin/env bash
# The tests of kubetrain's runtime (what runs beside user code: the torchrun hooks, the in-place
# agent, the stop vote, the watchdog, the records, the framework adapters) on the lowest torch the
# README claims, in a venv of that torch beside the project's: tests/run.sh runs it in a full run,
# after the unit and train tiers on the pinned torch. The venv is cached under
# ${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain/venv-torch-<version> and rebuilt when pyproject.toml or
# this script changes (~4 min cold: torch's CUDA wheels are 3.7 GB from PyPI); kubetrain itself is
# installed editable from the checkout that runs it, every time.
#   bash tests/cluster/low-torch.sh [pytest args...]      (KUBETRAIN_VENV: the project's venv)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../.."
LOW_TORCH=2.8.0
# The runtime's tests: unit and train tier modules that run nothing but it (and the built-in
# trainer's hang forensics, which share its watchdog).
RUNTIME_TESTS=(
  tests/trainer/test_torchrun_hooks.py tests/trainer/test_agent.py tests/trainer/test_agents_torchrun.py
  tests/trainer/test_attempt_store.py tests/trainer/test_step_watch.py tests/trainer/test_stopping.py
  tests/trainer/test_guest_records.py tests/trainer/test_runtime_bundle.py tests/trainer/test_torch_private.py
  tests/trainer/test_hf_adapter.py tests/trainer/test_lightning_adapter.py tests/trainer/test_launcher.py
  tests/local/test_hf_trainer.py tests/local/test_lightning.py tests/local/test_in_place_local.py
  tests/local/test_hang_forensics.py
)
PROJECT_PYTHON=${KUBETRAIN_VENV:-$PWD/.venv}/bin/python
VENV=${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain/venv-torch-$LOW_TORCH
KEY=$(cat pyproject.toml "$0" | sha256sum | cut -c1-16)

if [ ! -f "$VENV/.kubetrain-$KEY" ]; then
  rm -rf "$VENV"
  "$PROJECT_PYTHON" -m venv "$VENV"
  # The test tools and frameworks at the [dev] extra's pins (written there once), torch at LOW_TORCH.
  mapfile -t DEPS < <("$PROJECT_PYTHON" - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as file:
    dev = tomllib.load(file)["project"]["optional-dependencies"]["dev"]
wanted = {"pytest", "pytest-timeout", "pytest-xdist", "psutil", "jsonschema", "vermin", "transformers", "accelerate", "lightning"}
print("\n".join(pin for pin in dev if pin.split("=")[0].split(">")[0] in wanted))
PY
  )
  # Editable from the start: a regular install replaced by an editable one later leaves an empty
  # site-packages/kubetrain/, which imports as a namespace package (the bundle's tests need a
  # Python without kubetrain on that path).
  "$VENV/bin/python" -m pip install -q "torch==$LOW_TORCH" -e ".[worker,local]" "${DEPS[@]}" \
    --config-settings editable_mode=strict
  touch "$VENV/.kubetrain-$KEY"
else
  # kubetrain itself from this checkout (seconds): the venv may have been made by another one
  # (CI's clean clone is a new path each time).
  "$VENV/bin/python" -m pip install -q --no-deps -e . --config-settings editable_mode=strict
fi
exec "$VENV/bin/python" -m pytest -m "unit or train" "$@" "${RUNTIME_TESTS[@]}"
