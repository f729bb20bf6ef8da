#!/usr/bin/env bash
# kind end-to-end: a throwaway kind cluster with both images built from the Dockerfile and
# loaded into it, then the shared end-to-end scenario (tests/e2e/test_cluster_e2e.py: helm
# install, the CPU example to Succeeded, a gang restart that resumes, `kubetrain logs`) run on
# it with KUBETRAIN_E2E_PROVIDER=kind. The scenario itself prints the diagnostics of a failed
# step (operator log, the job's events, rank 0's log); this script only makes the cluster.
#
# Needs docker (with a running daemon), kind, kubectl and helm on PATH, and a Python with
# kubetrain[operator,local], pytest and pytest-timeout installed.
# Usage: bash tests/e2e/kind-e2e.sh
# Knobs: KIND_CLUSTER (name, default kubetrain-e2e), KEEP_CLUSTER=1 (do not delete it at the end),
#        KIND_NODE_IMAGE (node image), PYTHON (default .venv/bin/python).
set -euo pipefail

cd "$(dirname "$0")/../.."
CLUSTER=${KIND_CLUSTER:-kubetrain-e2e}
PYTHON=${PYTHON:-.venv/bin/python}
# The tags the chart and the examples name: the CPU example runs kubetrain/trainer:0.1.0-cpu.
OPERATOR_IMAGE=kubetrain/operator:0.1.0
TRAINER_IMAGE=kubetrain/trainer:0.1.0-cpu
START=$SECONDS

log() { printf '[e2e %4ds] %s\n' "$((SECONDS - START))" "$*"; }
fail() {
  log "FAIL: $*"
  exit 1
}

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH"
done
docker info >/dev/null 2>&1 || fail "docker has no running daemon (docker info failed)"
"$PYTHON" -c 'import kubetrain.client.logs, pytest, pytest_timeout' ||
  fail "$PYTHON lacks kubetrain[operator,local], pytest or pytest-timeout"

finish() {
  local status=$?
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  log "exit $status"
}
trap finish EXIT

log "kind cluster $CLUSTER"
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 120s
fi
kubectl config use-context "kind-$CLUSTER"

log "build images"
docker build --target operator -t "$OPERATOR_IMAGE" .
docker build --target trainer --build-arg TRAINER_BASE=python:3.11-slim-bookworm -t "$TRAINER_IMAGE" .
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$TRAINER_IMAGE"

log "the end-to-end scenario on kind"
# The control plane is required: a skip of the scenario (a missing tool) fails the run.
KUBETRAIN_E2E_PROVIDER=kind KUBETRAIN_REQUIRE_CONTROL_PLANE=1 \
  "$PYTHON" -m pytest tests/e2e/test_cluster_e2e.py -ra -s
log "PASS"
