#!/usr/bin/env bash
# kind end-to-end: a throwaway kind cluster, both images built and loaded, the chart installed,
# the CPU example trained to Succeeded, then a second run whose pod is deleted mid-training to
# see the gang restart and resume from its checkpoint.
#
# Needs docker (with a running daemon), kind, kubectl and helm on PATH.
# Usage: bash tests/e2e/kind-e2e.sh
# Knobs: KIND_CLUSTER (name, default kubetrain-e2e), KEEP_CLUSTER=1 (do not delete it at the end),
#        E2E_TIMEOUT (kubectl wait timeout per job, default 15m), KIND_NODE_IMAGE (node image).
set -euo pipefail

cd "$(dirname "$0")/../.."
CLUSTER=${KIND_CLUSTER:-kubetrain-e2e}
TIMEOUT=${E2E_TIMEOUT:-15m}
RELEASE=kubetrain
OPERATOR_NS=kubetrain-system
JOB_NS=e2e
# The tags the examples name: the CPU example runs kubetrain/trainer:0.1.0-cpu.
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

# Everything a failed run needs to be understood, then the cluster goes (unless KEEP_CLUSTER=1).
finish() {
  local status=$?
  if [ "$status" -ne 0 ] && kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "diagnostics"
    kubectl get trainingjobs,pods,services,pvc -A -o wide || true
    kubectl -n "$JOB_NS" get trainingjobs -o yaml || true
    kubectl -n "$JOB_NS" get events --sort-by=.lastTimestamp || true
    kubectl -n "$OPERATOR_NS" logs "deployment/$RELEASE" --tail=200 || true
    for pod in $(kubectl -n "$JOB_NS" get pods -o name 2>/dev/null); do
      echo "--- $pod"
      kubectl -n "$JOB_NS" logs "$pod" --tail=50 || true
    done
  fi
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  log "exit $status"
}
trap finish EXIT

# jsonpath of a TrainingJob, empty when the field is not there yet.
job_field() {
  kubectl -n "$JOB_NS" get trainingjob "$1" -o "jsonpath={$2}" 2>/dev/null || true
}

# Waits until a TrainingJob's integer field reaches a minimum; fails on timeout or job failure.
wait_for_at_least() {
  local job=$1 path=$2 minimum=$3 seconds=$4 value
  local deadline=$((SECONDS + seconds))
  while [ "$SECONDS" -lt "$deadline" ]; do
    value=$(job_field "$job" "$path")
    if [ -n "$value" ] && [ "$value" -ge "$minimum" ]; then
      log "$job $path = $value"
      return 0
    fi
    [ "$(job_field "$job" .status.phase)" != Failed ] || fail "$job failed while waiting for $path >= $minimum"
    sleep 2
  done
  fail "$job: $path did not reach $minimum in ${seconds}s"
}

log "kind cluster $CLUSTER"
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 120s
fi
kubectl config use-context "kind-$CLUSTER"

log "build images"
docker build --target operator -t "$OPERATOR_IMAGE" .
docker build --target trainer --build-arg TRAINER_BASE=python:3.11-slim-bookworm -t "$TRAINER_IMAGE" .
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$TRAINER_IMAGE"

log "helm install"
helm upgrade --install "$RELEASE" charts/kubetrain \
  --namespace "$OPERATOR_NS" --create-namespace \
  --set fullnameOverride="$RELEASE" \
  --set image.repository="${OPERATOR_IMAGE%:*}" --set image.tag="${OPERATOR_IMAGE##*:}" \
  --set image.pullPolicy=Never \
  --set operator.trainerImage="$TRAINER_IMAGE" \
  --set operator.progressIntervalSeconds=5 \
  --wait --timeout 5m
kubectl create namespace "$JOB_NS" --dry-run=client -o yaml | kubectl apply -f -

log "1/2: the CPU example runs to Succeeded"
kubectl -n "$JOB_NS" apply -f examples/digits-cpu.yaml
kubectl -n "$JOB_NS" wait --for=condition=Succeeded trainingjob/digits-cpu --timeout="$TIMEOUT"
percent=$(job_field digits-cpu .status.progress.percent)
step=$(job_field digits-cpu .status.progress.step)
total=$(job_field digits-cpu .status.progress.totalSteps)
log "digits-cpu: step $step/$total ($percent%), loss $(job_field digits-cpu .status.progress.loss)"
[ "$percent" = 100 ] || fail "status.progress.percent is '$percent', expected 100"
if [ -z "$step" ] || [ "$step" != "$total" ]; then
  fail "status.progress.step '$step' != totalSteps '$total'"
fi
[ "$(job_field digits-cpu .status.restarts)" = 0 ] || fail "digits-cpu restarted without a failure"
# Finished pods are kept (cleanPodPolicy: Running) so rank 0's log is still readable.
logs=$(kubectl -n "$JOB_NS" logs digits-cpu-node-0)
grep -q '"event":"step"' <<<"$logs" || fail "rank 0's log has no step records"

log "2/2: a pod deleted mid-run restarts the gang, which resumes from its checkpoint"
# The same example, renamed and trained 25x longer (~6600 steps; the example's 264 take ~3 s
# once torch is up) so that there is time to interrupt it.
sed -e 's/digits-cpu/digits-restart/g' -e 's/epochs: 12$/epochs: 300/' examples/digits-cpu.yaml |
  kubectl -n "$JOB_NS" apply -f -
# Interrupt as soon as rank 0 has written a checkpoint: its log says so before the operator's
# next progress read would.
checkpoint=
deadline=$((SECONDS + 600))
while [ -z "$checkpoint" ] && [ "$SECONDS" -lt "$deadline" ]; do
  sleep 1
  # The pod may not exist yet: under pipefail a failed kubectl would end the script.
  checkpoint=$({ kubectl -n "$JOB_NS" logs digits-restart-node-0 2>/dev/null || true; } |
    sed -nE 's/.*"event":"checkpoint","time":[^,]*,"step":([0-9]+).*/\1/p' | tail -1)
done
[ -n "$checkpoint" ] || fail "digits-restart wrote no checkpoint in 600s"
[ "$(job_field digits-restart .status.phase)" != Succeeded ] || fail "digits-restart finished before it could be interrupted"
log "rank 0 wrote the checkpoint at step $checkpoint: deleting node 1"
kubectl -n "$JOB_NS" delete pod digits-restart-node-1 --wait=false
wait_for_at_least digits-restart .status.restarts 1 300
kubectl -n "$JOB_NS" wait --for=condition=Succeeded trainingjob/digits-restart --timeout="$TIMEOUT"
reason=$(job_field digits-restart '.status.failures[0].reason')
log "digits-restart: restarts $(job_field digits-restart .status.restarts), first failure: $reason"
[ "$reason" = PodDeleted ] || fail "status.failures[0].reason is '$reason', expected PodDeleted"
[ "$(job_field digits-restart .status.attempt)" -ge 1 ] || fail "status.attempt did not advance"
[ "$(job_field digits-restart .status.progress.percent)" = 100 ] || fail "digits-restart did not finish its steps"
# The new attempt's rank 0 loads the newest complete checkpoint instead of starting at step 0:
# its metrics records (one JSON object per line) include {"event":"resume","time":...,"step":N}.
logs=$(kubectl -n "$JOB_NS" logs digits-restart-node-0)
resumed=$(sed -nE 's/.*"event":"resume","time":[^,]*,"step":([0-9]+).*/\1/p' <<<"$logs" | head -1)
if [ -z "$resumed" ] || [ "$resumed" -lt "$checkpoint" ]; then
  fail "rank 0 did not resume from the checkpoint at step $checkpoint (resume record: '${resumed:-none}')"
fi
log "resumed at step $resumed (checkpoint seen before the kill: step $checkpoint)"

log "PASS"
