#!/usr/bin/env bash
# Builds the two images of the repository's Dockerfile, unmodified, and a third for the tests, with
# buildah and without a registry, into one OCI image layout the real-node tests import from:
#   docker.io/kubetrain/operator:0.1.0     --target operator
#   docker.io/kubetrain/trainer:0.1.0-cpu  --target trainer, TRAINER_BASE=python:3.11-slim-bookworm
#   docker.io/kubetrain/guest:0.1.0-cpu    tests/cluster/guest.Dockerfile: ONE layer on the
#                                          Dockerfile's trainer-deps stage, a user's own image
#                                          (torch, transformers, accelerate, Lightning at pyproject's
#                                          [dev] pins; no kubetrain, no pydantic)
# No registry serves base images here, so the Dockerfile's FROM image is made first: a Debian
# bookworm minbase (debootstrap) with python3 and a virtualenv at /usr/local, so `python` and
# `pip` come first on PATH and pip may install (PEP 668 does not apply in a virtualenv), the way
# the official image behaves. It is committed under the FROM name and built with --pull=never.
#
# Layers that match how they change: the Dockerfile installs each image's dependencies (torch for
# the trainer, kopf for the operator) in stages that read pyproject's dependency lists and none of
# kubetrain's code, and kubetrain on top. buildah builds with --layers, its layer cache kept in its
# storage, so a change to kubetrain's Python rebuilds only the small top layers; skopeo copies each
# image into the layout with its layers uncompressed, which lets it skip every blob already there
# (buildah's own push compresses each layer again first); the node imports only the blobs its
# containerd lacks (tests/support/ocilayout.py). torch's GBs are built, written and imported once
# per pin.
#
# Caching, all under ${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain/images/:
#   buildah/                  buildah's storage: the base, the images and their layer cache
#   base-<recipe>.stamp       the base was built from this script's recipe (build_base + pins)
#   wheels-torch-<version>/   torch and its CUDA wheels from PyPI, downloaded once on the host
#                             with a PEP 503 index over them (simple/), bind-mounted at /mnt (an
#                             empty directory of the base, so no mount point is left in the image)
#                             and passed as TORCH_INDEX_URL=file:///mnt/simple: a rebuild of the
#                             stage does not download ~2.8 GB again, and the trainer holds the
#                             files an online build from PyPI installs
#   wheels-frameworks-<pins>/ the guest's frameworks and what they need beyond torch, the same way
#                             (downloaded once, an index, bind-mounted at /mnt for the guest's RUN)
#   layout/                   the OCI layout; each image is tagged <name>-<key> there. <key>
#                             hashes what decides its content: for the operator and the trainer
#                             the Dockerfile, .dockerignore, every file its COPY instructions read,
#                             the base recipe, this script's build functions, the target and build
#                             args; for the guest the Dockerfile, pyproject.toml, the base recipe
#                             and the guest's recipe (guest.Dockerfile, pins, functions), not
#                             kubetrain's code. Other tags and their blobs are removed after a build.
# A warm run (nothing changed) only hashes the sources.
#
# RUN steps run in a chroot (`--isolation chroot`: crun refused this VM's hybrid cgroups, "cgroups
# in hybrid mode not supported") on the host's network (buildah's default networking rewrites host
# iptables and bridges) with the host's CA bundle, since package traffic may pass a
# TLS-intercepting proxy. PyPI's linux torch wheel is the CUDA build (the CPU index the
# Dockerfile names is not reachable here): the trainer image is several GB. Failed builds leave
# no working containers behind (--force-rm).
#
# Usage: bash tests/cluster/build-images.sh [--print]    (as root, except --print)
#   --print  prints the images for the current sources without building anything
# tests/run.sh runs it for the tiers whose tests use the images (node, e2e, all).
# Last lines: OPERATOR_IMAGE=oci:<layout>:<tag>, TRAINER_IMAGE=oci:<layout>:<tag> and
# GUEST_IMAGE=oci:<layout>:<tag>.
set -euo pipefail
shopt -s inherit_errexit

# --- pins ---------------------------------------------------------------------------------------
BASE_SUITE=bookworm
BASE_MIRROR=http://deb.debian.org/debian
BASE_PACKAGES=python3,python3-venv,ca-certificates
PYPI_INDEX=https://pypi.org/simple
# Free space a build of the trainer's torch stage takes at its peak (the installed wheels in the
# container, their layer while it is committed, then the layout's copy): asked only when that
# stage is not in buildah's storage yet (a change to kubetrain's code needs a few hundred MB).
TRAINER_BUILD_GB=22
# -------------------------------------------------------------------------------------------------

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DOCKERFILE=$ROOT/Dockerfile
GUEST_DOCKERFILE=$ROOT/tests/cluster/guest.Dockerfile
OPERATOR_REF=docker.io/kubetrain/operator:0.1.0
TRAINER_REF=docker.io/kubetrain/trainer:0.1.0-cpu
GUEST_REF=docker.io/kubetrain/guest:0.1.0-cpu
DEPS_REF=docker.io/kubetrain/trainer-deps:0.1.0-cpu
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain/images
# The real node's containerd root (tests/support/realnode.py image_store()): it keeps the images it
# imported, ~12 GB of blobs and their unpacked snapshots, most of them torch's layers, which a
# change to kubetrain's code leaves as they are (the next node imports the new top layers only).
NODE_STORE=${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain/node-containerd-root
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
LAYOUT=$CACHE/layout
STORAGE=$CACHE/buildah
RUNROOT=/run/kubetrain-images/buildah
START=$SECONDS

log() { printf '[images %4ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
die() { printf 'build-images.sh: %s\n' "$*" >&2; exit 1; }

# The Dockerfile's own ARG default, so a pin is written in one place.
dockerfile_arg() {
  awk -F= -v name="$1" '$1 == "ARG " name { print $2; exit }' "$DOCKERFILE"
}

BASE_REF=docker.io/library/$(dockerfile_arg PYTHON_BASE)
TORCH_VERSION=$(dockerfile_arg TORCH_VERSION)
if [ -z "$TORCH_VERSION" ] || [ "$BASE_REF" = docker.io/library/ ]; then
  die "$DOCKERFILE lacks ARG PYTHON_BASE or ARG TORCH_VERSION"
fi

# The guest's frameworks at the [dev] extra's exact pins, so a pin is written in one place (the
# tests on this machine run the same versions).
framework_pins() {
  awk '/^dev = \[/ { dev = 1; next }
       dev && /^\]/ { exit }
       dev && match($0, /"(transformers|accelerate|lightning)==[^"]+"/) {
         print substr($0, RSTART + 1, RLENGTH - 2)
       }' "$ROOT/pyproject.toml"
}

mapfile -t FRAMEWORKS < <(framework_pins)
if [ "${#FRAMEWORKS[@]}" -ne 3 ]; then
  die "$ROOT/pyproject.toml's [dev] extra must pin transformers, accelerate and lightning with ==; found: ${FRAMEWORKS[*]:-none}"
fi

buildah_() {
  buildah --root "$STORAGE" --runroot "$RUNROOT" --storage-driver overlay "$@"
}

# --- the Python base ------------------------------------------------------------------------------
build_base() {
  local ctr mnt
  ctr=$(buildah_ from scratch)
  mnt=$(buildah_ mount "$ctr")
  debootstrap --variant=minbase --include="$BASE_PACKAGES" "$BASE_SUITE" "$mnt" "$BASE_MIRROR" >&2
  # /usr/local/bin precedes /usr/bin on PATH: python, python3 and pip resolve to the venv.
  chroot "$mnt" /usr/bin/python3 -m venv /usr/local
  chroot "$mnt" /usr/bin/apt-get clean
  # The runtime supplies /dev, resolv.conf and the hostname; debootstrap copied the host's.
  rm -rf "${mnt:?}"/dev/* "$mnt"/var/lib/apt/lists/* "$mnt"/etc/resolv.conf "$mnt"/etc/hostname
  buildah_ umount "$ctr" >/dev/null
  buildah_ config --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$ctr"
  buildah_ commit --rm "$ctr" "$BASE_REF" >/dev/null
}

base_recipe() {
  { declare -f build_base; echo "$BASE_SUITE $BASE_MIRROR $BASE_PACKAGES $BASE_REF"; } |
    sha256sum | cut -c1-16
}

ensure_base() {
  local stamp=$CACHE/base-$BASE_RECIPE.stamp t0=$SECONDS
  if [ -f "$stamp" ] && buildah_ inspect --type image "$BASE_REF" >/dev/null 2>&1; then
    log "base $BASE_REF cached ($stamp)"
    return
  fi
  rm -f "$CACHE"/base-*.stamp
  buildah_ rmi -f "$BASE_REF" >/dev/null 2>&1 || true
  log "building base $BASE_REF: debootstrap $BASE_SUITE minbase + $BASE_PACKAGES"
  build_base
  touch "$stamp"
  log "base built in $((SECONDS - t0)) s, $(buildah_ images --format '{{.Size}}' "$BASE_REF")"
}

# --- content keys ---------------------------------------------------------------------------------
# What the build context puts into the images: the sources of every COPY without --from, minus
# what .dockerignore drops from those folders (caches, egg-info).
copy_sources() {
  awk 'toupper($1) == "COPY" && $2 !~ /^--from/ {
         for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i
       }' "$DOCKERFILE"
}

sources_hash() {
  local -a sources
  mapfile -t sources < <(copy_sources)
  (
    cd "$ROOT"
    { printf '%s\0' Dockerfile .dockerignore
      find "${sources[@]}" \( -name __pycache__ -o -name '*.egg-info' \) -prune \
        -o -type f ! -name '*.pyc' -print0 | LC_ALL=C sort -z
    } | xargs -0 sha256sum | sha256sum | cut -c1-64
  )
}

# image_key TARGET BUILD_ARG...: what decides an image's content, including how it is built.
image_key() {
  { printf '%s\n' "$SOURCES" "$BASE_RECIPE" "$@"; declare -f build_image build_stage publish_image; } |
    sha256sum | cut -c1-16
}

# guest_key: what decides the guest's content: the trainer-deps stage under it (the Dockerfile,
# pyproject's lists, the base, the torch build args) and its own recipe (guest.Dockerfile, the
# pins, how this script downloads and builds it). kubetrain's code is not part of it.
guest_key() {
  { (cd "$ROOT" && sha256sum Dockerfile pyproject.toml); cat "$GUEST_DOCKERFILE"
    printf '%s\n' "$BASE_RECIPE" "${TRAINER_ARGS[@]}" "${FRAMEWORKS[@]}"
    declare -f ensure_framework_wheels build_guest build_stage publish_image
  } | sha256sum | cut -c1-16
}

# --- the images -----------------------------------------------------------------------------------
ensure_wheels() {
  WHEELS=$CACHE/wheels-torch-$TORCH_VERSION
  if [ -f "$WHEELS/.complete" ]; then
    return
  fi
  local python=${KUBETRAIN_VENV:-$ROOT/.venv}/bin/python t0=$SECONDS
  [ -x "$python" ] || python=python3
  find "$CACHE" -maxdepth 1 -name 'wheels-torch-*' ! -path "$WHEELS" -exec rm -rf {} +
  # For the host's Python and platform: on a bookworm host with Python 3.11 (as here and in CI)
  # the same files the base's pip picks; elsewhere pip in the build simply downloads its own.
  log "downloading torch==$TORCH_VERSION and its dependencies from PyPI into $WHEELS"
  "$python" -m pip download -q --dest "$WHEELS" --index-url "$PYPI_INDEX" "torch==$TORCH_VERSION" >&2
  write_index "$WHEELS"
  touch "$WHEELS/.complete"
  log "wheels downloaded in $((SECONDS - t0)) s: $(du -sh "$WHEELS" | cut -f1)"
}

# ensure_framework_wheels: the guest's frameworks and what they need beyond torch, downloaded once
# like torch's; the directory is named by the pins and the torch the resolution is pinned to.
ensure_framework_wheels() {
  FRAMEWORK_WHEELS=$CACHE/wheels-frameworks-$(printf '%s\n' "$TORCH_VERSION" "${FRAMEWORKS[@]}" | sha256sum | cut -c1-16)
  if [ -f "$FRAMEWORK_WHEELS/.complete" ]; then
    return
  fi
  local python=${KUBETRAIN_VENV:-$ROOT/.venv}/bin/python t0=$SECONDS wheel
  [ -x "$python" ] || python=python3
  find "$CACHE" -maxdepth 1 -name 'wheels-frameworks-*' -exec rm -rf {} +
  mkdir -p "$FRAMEWORK_WHEELS"
  # accelerate and lightning require torch, and `pip download` fetches every dependency, installed
  # or not: torch and its CUDA wheels (~2.8 GB) again, though the trainer has them. pip takes a file
  # already in --dest as downloaded ("File was already downloaded"), so torch's wheels are hard-linked
  # in (same filesystem: no space, no traffic), the resolution is pinned to the trainer's torch, and
  # the links go afterwards. What stays is what the frameworks need beyond torch (with some the
  # trainer has too: the guest's pip skips those, as installed, and takes the rest from here).
  ln "$WHEELS"/*.whl "$FRAMEWORK_WHEELS"/
  log "downloading ${FRAMEWORKS[*]} and their dependencies but torch's from PyPI into $FRAMEWORK_WHEELS"
  "$python" -m pip download -q --dest "$FRAMEWORK_WHEELS" --index-url "$PYPI_INDEX" \
    "torch==$TORCH_VERSION" "${FRAMEWORKS[@]}" >&2
  for wheel in "$WHEELS"/*.whl; do
    rm -f "$FRAMEWORK_WHEELS/${wheel##*/}"
  done
  write_index "$FRAMEWORK_WHEELS"
  touch "$FRAMEWORK_WHEELS/.complete"
  log "framework wheels downloaded in $((SECONDS - t0)) s: $(du -sh "$FRAMEWORK_WHEELS" | cut -f1)," \
    "$(find "$FRAMEWORK_WHEELS" -maxdepth 1 -name '*.whl' | wc -l) wheels"
}

# write_index DIR: DIR/simple/<project>/index.html linking DIR's wheels, the layout pip reads from a
# file:// --index-url (project names normalized as PEP 503 says: lower case, runs of -_. as -).
write_index() {
  local wheel file project
  rm -rf "$1/simple"
  for wheel in "$1"/*.whl; do
    file=${wheel##*/}
    project=$(printf '%s' "${file%%-*}" | tr 'A-Z_.' 'a-z--' | tr -s -)
    mkdir -p "$1/simple/$project"
    printf '<a href="../../%s">%s</a>\n' "$file" "$file" >>"$1/simple/$project/index.html"
  done
}

# need_space GB WHAT: stop before a build that cannot fit, saying so (a full disk otherwise ends a
# long build in buildah's "no space left on device" while it commits the layer).
need_space() {
  local free_kb
  free_kb=$(df -Pk "$CACHE" | awk 'NR == 2 { print $4 }')
  if [ "$free_kb" -lt $(($1 * 1024 * 1024)) ]; then
    df -h "$CACHE" >&2
    du -sh "$CACHE"/* 2>/dev/null | sort -h | tail -5 >&2
    die "$2 needs ~$1 GB free on the filesystem of $CACHE; $((free_kb / 1024 / 1024)) GB are"
  fi
}

# drop_node_store: removes the node's containerd root unless a node uses it (a process holds a
# file in it, or something is mounted under it). Only before torch's stage is built anew: the
# node's copy of the old one is stale then, and on a shared disk those ~12 GB decided whether the
# build fits. Otherwise the store is what makes an image change cheap: it holds the layers below.
drop_node_store() {
  [ -d "$NODE_STORE" ] || return 0
  if find /proc/[0-9]*/fd -lname "$NODE_STORE/*" -print -quit 2>/dev/null | grep -q . ||
    awk -v root="$NODE_STORE/" 'index($2, root) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    log "the node's image store $NODE_STORE is in use: kept"
    return 0
  fi
  log "removing the node's image store ($(du -sh "$NODE_STORE" | cut -f1)): its torch layers are stale"
  rm -rf "$NODE_STORE"
}

# build_stage REF TARGET BUILD_ARG...: `buildah bud --layers` of the Dockerfile's TARGET as REF.
# The layer cache in buildah's storage makes every step whose inputs did not change a lookup.
build_stage() {
  local ref=$1 target=$2 t0=$SECONDS
  shift 2
  local -a args=(-v "$CA_BUNDLE:$CA_BUNDLE:ro")
  # Only the trainer's stages install torch (from TORCH_INDEX_URL=file:///mnt/simple).
  [ "${target#trainer}" = "$target" ] || args+=(-v "$WHEELS:/mnt:ro")
  for arg in "$@"; do args+=(--build-arg "$arg"); done
  # Docker format, as `docker build` makes: in OCI format buildah 1.28 ignores the Dockerfile's
  # SHELL and runs RUN steps with /bin/sh. skopeo writes it to the layout as OCI.
  buildah_ bud --format docker --pull=never --isolation chroot --network host --layers \
    --force-rm --target "$target" -t "$ref" "${args[@]}" -f "$DOCKERFILE" "$ROOT" >&2
  log "$ref (--target $target): built in $((SECONDS - t0)) s"
}

# build_image NAME REF TARGET BUILD_ARG...: prints the image (oci:<layout>:<NAME>-<key>), building
# it when the layout lacks it.
build_image() {
  local name=$1 ref=$2 target=$3 key tag
  shift 3
  key=$(image_key "$target" "$@")
  tag=$name-$key
  if [ "$MODE" = print ] || has_tag "$tag"; then
    echo "oci:$LAYOUT:$tag"
    return
  fi
  if [ "$target" = trainer ]; then
    ensure_deps_room
    build_stage "$DEPS_REF" trainer-deps "$@"
  fi
  build_stage "$ref" "$target" "$@"
  publish_image "$ref" "$tag"
  echo "oci:$LAYOUT:$tag"
}

# ensure_deps_room: before torch's stage is built for the first time in this storage, room for it.
ensure_deps_room() {
  if ! buildah_ inspect --type image "$DEPS_REF" >/dev/null 2>&1; then
    drop_node_store
    need_space "$TRAINER_BUILD_GB" "building $DEPS_REF (torch's CUDA wheels installed, committed and copied)"
  fi
}

# build_guest: the guest image, one layer on the trainer-deps stage (tests/cluster/guest.Dockerfile).
# Its RUN needs no network (its wheels are at /mnt) and the build context is empty (it copies
# nothing); the other flags are the trainer's, for the same reasons. Prints it as build_image does.
build_guest() {
  local tag=guest-cpu-$GUEST_KEY t0 context
  if [ "$MODE" = print ] || has_tag "$tag"; then
    echo "oci:$LAYOUT:$tag"
    return
  fi
  context=$TMPDIR/guest-context
  ensure_deps_room
  build_stage "$DEPS_REF" trainer-deps "${TRAINER_ARGS[@]}"
  t0=$SECONDS
  mkdir -p "$context"
  log "building $GUEST_REF: one layer on $DEPS_REF with ${FRAMEWORKS[*]}, without pydantic"
  buildah_ bud --format docker --pull=never --isolation chroot --network host --layers \
    --force-rm -t "$GUEST_REF" -v "$FRAMEWORK_WHEELS:/mnt:ro" --build-arg "DEPS_IMAGE=$DEPS_REF" \
    --build-arg "FRAMEWORKS=${FRAMEWORKS[*]}" -f "$GUEST_DOCKERFILE" "$context" >&2
  log "$GUEST_REF: built in $((SECONDS - t0)) s"
  publish_image "$GUEST_REF" "$tag"
  echo "oci:$LAYOUT:$tag"
}

# has_tag TAG: the layout holds TAG (index.json read as JSON: skopeo and gc format it differently).
has_tag() {
  python3 "$ROOT/tests/support/ocilayout.py" has "$LAYOUT" "$1"
}

# publish_image REF TAG: REF from buildah's storage into the layout as TAG. Layers go uncompressed
# (--dest-oci-accept-uncompressed-layers): an uncompressed layer is named by its content's digest,
# which is how skopeo finds it already in the layout and skips it.
publish_image() {
  local ref=$1 tag=$2 t0=$SECONDS before after
  before=$(du -sb "$LAYOUT" 2>/dev/null | cut -f1 || echo 0)
  skopeo copy --quiet --dest-oci-accept-uncompressed-layers \
    "containers-storage:[overlay@$STORAGE+$RUNROOT]$ref" "oci:$LAYOUT:$tag" >&2
  after=$(du -sb "$LAYOUT" | cut -f1)
  log "$ref: written to the layout as $tag in $((SECONDS - t0)) s, $(((after - ${before:-0}) / 1024 / 1024)) MiB new"
}

# tidy: the layout keeps the current tags and their blobs; buildah's storage drops the images no
# tag or later build step refers to (a pass removes the untagged images nothing is built on; the
# layer cache of each dependency stage is under a tagged image, so it stays).
tidy() {
  python3 "$ROOT/tests/support/ocilayout.py" gc "$LAYOUT" "$@" >&2
  local pass
  for pass in 1 2 3 4 5 6 7 8 9 10 11 12; do
    [ -n "$(buildah_ rmi --prune 2>/dev/null)" ] || break
  done
  log "tidied in $pass prune passes; storage $(du -shx "$STORAGE" | cut -f1), layout $(du -shx "$LAYOUT" | cut -f1)"
}

main() {
  MODE=build
  case "${1:-}" in
    --print) MODE=print ;;
    "") ;;
    *) die "unknown argument $1 (usage: build-images.sh [--print])" ;;
  esac
  BASE_RECIPE=$(base_recipe)
  SOURCES=$(sources_hash)
  TRAINER_ARGS=("TRAINER_BASE=${BASE_REF#docker.io/library/}" "TORCH_INDEX_URL=file:///mnt/simple")
  GUEST_KEY=$(guest_key)
  local operator trainer guest
  if [ "$MODE" = build ]; then
    [ "$(id -u)" -eq 0 ] || die "needs root (buildah, debootstrap, chroot)"
    mkdir -p "$CACHE"
    # One build at a time owns the storage, so an interrupted build's working containers (which
    # --force-rm cannot reach) are removed on exit without touching another build's.
    exec 9>"$CACHE/.lock"
    flock 9
    trap 'buildah_ rm --all >/dev/null 2>&1 || true' EXIT
    # buildah's temporary copies of a layer (GBs for the trainer) stay in the cache, where an
    # interrupted build's leftovers are found and removed by the next run.
    export TMPDIR=$CACHE/tmp
    rm -rf "$TMPDIR"
    mkdir -p "$TMPDIR"
    # The single-archive images of earlier versions of this script.
    find "$CACHE" -maxdepth 1 -name '*.oci.tar*' -exec rm -rf {} +
    install_tools
    ensure_base
    ensure_wheels
    ensure_framework_wheels
  fi
  operator=$(build_image operator "$OPERATOR_REF" operator)
  trainer=$(build_image trainer-cpu "$TRAINER_REF" trainer "${TRAINER_ARGS[@]}")
  guest=$(build_guest)
  if [ "$MODE" = build ]; then
    tidy "${operator##*:}" "${trainer##*:}" "${guest##*:}"
    log "done; cache $(du -shx "$CACHE" | cut -f1) in $CACHE"
  fi
  echo "OPERATOR_IMAGE=$operator"
  echo "TRAINER_IMAGE=$trainer"
  echo "GUEST_IMAGE=$guest"
}

install_tools() {
  command -v buildah >/dev/null && command -v debootstrap >/dev/null && command -v skopeo >/dev/null && return
  log "installing buildah, skopeo and debootstrap (Debian packages)"
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    buildah skopeo debootstrap >&2
}

main "$@"
