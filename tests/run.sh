#!/usr/bin/env bash
# The README's test command: installs what the chosen tier's tests need (idempotent, cached),
# then runs lint, types and those tests.
#   bash tests/run.sh [--tier unit|train|cluster|node|e2e|bench|all] [pytest args...]
# Each test carries exactly one tier marker (tests/support/tiers.py); a tier builds only its needs:
#   unit     Python and torch only, no training run: pip, nothing built, no root
#   train    real multi-process training on this machine: as unit, minutes of CPU more
#   cluster  + the control plane, helm and Kueue (tests/cluster/install.sh)
#   node     + as root: the real node (packages, kubelet, CoreDNS) and the images (build-images.sh)
#   e2e      the node's needs and helm: the end-to-end scenario
#   bench    + the Kubeflow operator (a benchmark's peer) and, as root, the real node and the images
#   all      (default, what CI runs through .ci/run) everything, and every test: the unit and
#            train tiers first, spread over the cores, then the runtime's on the lowest torch
#            README claims (LOW_TORCH, its own venv), then the rest, side by side by module
# Without root the node and the images are not built: their tests skip, naming root.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${KUBETRAIN_VENV:-$ROOT/.venv}

TIER=all
if [ "${1:-}" = --tier ]; then
  TIER=${2:-}
  shift 2 || true
fi
case $TIER in
  unit | train) COMPONENTS=() ;;
  cluster) COMPONENTS=(k8s helm kueue) ;;
  node) COMPONENTS=(k8s node) ;;
  e2e) COMPONENTS=(k8s helm node) ;;
  bench) COMPONENTS=(k8s kubeflow node) ;;
  all) COMPONENTS=(k8s helm kueue kubeflow node) ;;
  *) echo "tests/run.sh: unknown tier '$TIER' (expected unit, train, cluster, node, e2e, bench or all)" >&2; exit 2 ;;
esac
IMAGES=0
case $TIER in node | e2e | bench | all) IMAGES=1 ;; esac

START=$SECONDS
# The budget: each phase's seconds, printed as a table when the run ends (pass or fail), so a CI
# log says where its time went. It only reports; nothing fails on time.
PHASES=()
PHASE_NAME=""
PHASE_START=$SECONDS
end_phase() {
  [ -z "$PHASE_NAME" ] || PHASES+=("$(printf '%6ds  %s' "$((SECONDS - PHASE_START))" "$PHASE_NAME")")
  PHASE_NAME=""
}
# shellcheck disable=SC2329  # invoked by the EXIT trap below
budget() {
  end_phase
  printf '\n== budget (seconds per phase; the slowest tests are listed above)\n'
  printf '%s\n' "${PHASES[@]}"
  printf '%6ds  total\n' "$((SECONDS - START))"
}
trap budget EXIT
step() {
  end_phase
  PHASE_NAME=$*
  PHASE_START=$SECONDS
  printf '\n== [%4ds] %s\n' "$((SECONDS - START))" "$*"
}

step "python environment ($VENV)"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# strict editable mode: a link tree mypy can read; the folders map to kubetrain.operator
# and kubetrain.trainer (the stdlib owns the bare name `operator`).
"$VENV/bin/python" -m pip install -q -e ".[dev]" --config-settings editable_mode=strict
export PATH="$VENV/bin:$PATH"

if [ ${#COMPONENTS[@]} -gt 0 ]; then
  step "binaries: ${COMPONENTS[*]} (cached under ${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain)"
  bash tests/cluster/install.sh "${COMPONENTS[@]}"
fi

if [ "$IMAGES" = 1 ] && [ "$(id -u)" -ne 0 ]; then
  step "images skipped: not root (buildah; the tests that run them need root too)"
elif [ "$IMAGES" = 1 ]; then
  step "images from the Dockerfile (buildah, cached by content)"
  KUBETRAIN_VENV=$VENV bash tests/cluster/build-images.sh
fi

step "ruff"
ruff check .
ruff format --check .

step "mypy"
mypy

# The unit and train tiers' tests wait on processes of their own much of the time: pytest-xdist
# spreads them over the cores (2 idle cores: 9.0 -> 6.8 min for both; at most 4 workers, each test
# may start 5 torch processes).
PARALLEL=(-n "${KUBETRAIN_TEST_WORKERS:-logical}" --maxprocesses 4)
# The tiers above mostly wait (kubelet syncs, back-offs, grace periods): they run after, on
# workers of their own, each with its own control plane; every module that starts the real node
# on one worker, one module after another, the others on the second (tests/support/worker_groups.py;
# a third worker only adds load: the node's modules are the longest part either way).
WAITING=(-n "${KUBETRAIN_WAITING_WORKERS:-2}" --dist loadscope --no-loadscope-reorder)
# The slowest tests of each run, printed at its end: where CI's time goes.
SLOWEST=(--durations=15 --durations-min=20)
case $TIER in
  unit | train)
    step "pytest -m $TIER ${PARALLEL[*]}"
    status=0
    python -m pytest -m "$TIER" "${PARALLEL[@]}" "$@" || status=$?
    exit "$status"
    ;;
  all) ;;
  *)
    step "pytest -m $TIER ${WAITING[*]}"
    status=0
    python -m pytest -m "$TIER" "${WAITING[@]}" "$@" || status=$?
    exit "$status"
    ;;
esac
step "pytest -m 'unit or train' ${PARALLEL[*]}"
unit=0
python -m pytest -m "unit or train" "${PARALLEL[@]}" "${SLOWEST[@]}" "$@" || unit=$?
# The runtime beside user code on the lowest torch README claims too (its own venv, cached).
step "the runtime's tests on the lowest claimed torch (tests/cluster/low-torch.sh)"
low=0
KUBETRAIN_VENV=$VENV bash tests/cluster/low-torch.sh "${PARALLEL[@]}" "$@" || low=$?
step "pytest -m 'not unit and not train' ${WAITING[*]}"
rest=0
python -m pytest -m "not unit and not train" "${WAITING[@]}" "${SLOWEST[@]}" "$@" || rest=$?
# pytest's 5 (nothing collected) in one half is no failure when the other half ran tests.
for status in "$unit" "$low" "$rest"; do
  case $status in 0 | 5) ;; *) exit "$status" ;; esac
done
[ "$unit" = 5 ] && [ "$rest" = 5 ] && exit 5
exit 0
