#!/usr/bin/env bash
# Builds the two images of the repository's Dockerfile, unmodified, and a third on the trainer, with
# buildah and without a registry, and saves them as OCI archives the real-node tests import into
# containerd:
#   docker.io/kubetrain/operator:0.1.0     --target operator
#   docker.io/kubetrain/trainer:0.1.0-cpu  --target trainer, TRAINER_BASE=python:3.11-slim-bookworm
#   docker.io/kubetrain/guest:0.1.0-cpu    tests/cluster/guest.Dockerfile: ONE layer on the trainer,
#                                          a user's own image (torch, transformers, accelerate,
#                                          Lightning at pyproject's [dev] pins; no kubetrain, no
#                                          pydantic). It is built whenever the trainer is and goes
#                                          into the trainer's archive: one OCI layout holding both
#                                          refs shares the trainer's blobs, so the guest costs its
#                                          layer only, and one `ctr images import` names both
# No registry serves base images here, so the Dockerfile's FROM image is made first: a Debian
# bookworm minbase (debootstrap) with python3 and a virtualenv at /usr/local, so `python` and
# `pip` come first on PATH and pip may install (PEP 668 does not apply in a virtualenv), the way
# the official image behaves. It is committed under the FROM name and built with --pull=never.
#
# Caching, all under ${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain/images/:
#   buildah/                  buildah's own storage (holds the base image only between runs)
#   base-<recipe>.stamp       the base was built from this script's recipe (build_base + pins)
#   wheels-torch-<version>/   torch and its CUDA wheels from PyPI, downloaded once on the host
#                             with a PEP 503 index over them (simple/), bind-mounted at /mnt (an
#                             empty directory of the base, so no mount point is left in the image)
#                             and passed as TORCH_INDEX_URL=file:///mnt/simple: a source change
#                             does not download ~2.8 GB again, and the trainer holds the files an
#                             online build from PyPI installs
#   wheels-frameworks-<pins>/ the guest's frameworks and what they need beyond torch, the same way
#                             (downloaded once, an index, bind-mounted at /mnt for the guest's RUN)
#   <name>-<key>.oci.tar      an image; <key> hashes the Dockerfile, .dockerignore, every file
#                             its COPY instructions read, the base recipe, this script's build
#                             functions, the target and build args; the trainer's (which holds the
#                             guest too) also the guest's recipe (guest.Dockerfile, pins, functions)
# A warm run (nothing changed) only hashes the sources. Older archives of a name are removed.
#
# RUN steps run in a chroot (`--isolation chroot`: crun refused this VM's hybrid cgroups, "cgroups
# in hybrid mode not supported") on the host's network (buildah's default networking rewrites host
# iptables and bridges) with the host's CA bundle, since package traffic may pass a
# TLS-intercepting proxy. PyPI's linux torch wheel is the CUDA build (the CPU index the
# Dockerfile names is not reachable here): the trainer image is several GB. Failed builds leave
# no working containers behind (--force-rm).
#
# Usage: bash tests/cluster/build-images.sh [--print]    (as root, except --print)
#   --print  prints the archive paths for the current sources without building anything
# tests/run.sh runs it for the tiers whose tests use the images (node, e2e, all).
# Last lines: OPERATOR_IMAGE_ARCHIVE=<path>, TRAINER_IMAGE_ARCHIVE=<path> and
# GUEST_IMAGE_ARCHIVE=<path> (the trainer's archive: it holds both).
set -euo pipefail
shopt -s inherit_errexit

# --- pins ---------------------------------------------------------------------------------------
BASE_SUITE=bookworm
BASE_MIRROR=http://deb.debian.org/debian
BASE_PACKAGES=python3,python3-venv,ca-certificates
PYPI_INDEX=https://pypi.org/simple
# Free space the trainer's build takes at its peak (the installed wheels in the container, their
# layer while it is committed, then the OCI layout and its tar): 25.9 GB measured with torch 2.15.0.
# The guest adds ~0.2 GB to storage, layout and tar; with it 22.2 GB was the most seen (df every 3 s).
TRAINER_BUILD_GB=26
# -------------------------------------------------------------------------------------------------

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DOCKERFILE=$ROOT/Dockerfile
GUEST_DOCKERFILE=$ROOT/tests/cluster/guest.Dockerfile
OPERATOR_REF=docker.io/kubetrain/operator:0.1.0
TRAINER_REF=docker.io/kubetrain/trainer:0.1.0-cpu
GUEST_REF=docker.io/kubetrain/guest:0.1.0-cpu
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain/images
# The real node's containerd root (tests/support/realnode.py image_store()): it keeps the trainer
# image it imported last, ~12 GB of blobs and their unpacked snapshot, stale once the trainer is
# rebuilt (its archive is gone; the next node imports the new one and its small images again).
NODE_STORE=${XDG_CACHE_HOME:-$HOME/.cache}/kubetrain/node-containerd-root
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
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
  buildah --root "$CACHE/buildah" --runroot /run/kubetrain-images/buildah --storage-driver overlay "$@"
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
  { printf '%s\n' "$SOURCES" "$BASE_RECIPE" "$@"; declare -f build_image archive_image write_index; } |
    sha256sum | cut -c1-16
}

# guest_recipe: what decides the guest's content besides the trainer under it (its Dockerfile, the
# pins, how this script downloads and builds it); part of the trainer's key, as its archive holds both.
guest_recipe() {
  { cat "$GUEST_DOCKERFILE"; printf '%s\n' "${FRAMEWORKS[@]}"; declare -f ensure_framework_wheels build_guest; } |
    sha256sum | cut -c1-16
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
# file in it, or something is mounted under it), so a rebuilt trainer does not need room for the
# stale one too: on a shared disk those ~12 GB decided whether the build fits.
drop_node_store() {
  [ -d "$NODE_STORE" ] || return 0
  if find /proc/[0-9]*/fd -lname "$NODE_STORE/*" -print -quit 2>/dev/null | grep -q . ||
    awk -v root="$NODE_STORE/" 'index($2, root) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    log "the node's image store $NODE_STORE is in use: kept"
    return 0
  fi
  log "removing the node's image store ($(du -sh "$NODE_STORE" | cut -f1)): its trainer image is stale"
  rm -rf "$NODE_STORE"
}

# build_image NAME REF TARGET BUILD_ARG...: prints the archive, building it when missing. The
# trainer's archive holds the guest too, built on it right after it.
build_image() {
  local name=$1 ref=$2 target=$3 key archive t0=$SECONDS
  shift 3
  local -a refs=("$ref") recipe=("$target" "$@")
  if [ "$target" = trainer ]; then
    refs+=("$GUEST_REF")
    recipe+=("guest $GUEST_RECIPE")
  fi
  key=$(image_key "${recipe[@]}")
  archive=$CACHE/$name-$key.oci.tar
  if [ -f "$archive" ] || [ "$MODE" = print ]; then
    echo "$archive"
    return
  fi
  # Older archives of this image go first: the trainer's are GBs and the disk is shared. So do its
  # images left in storage by a run that failed before archiving them (a guest whose check failed
  # leaves the trainer's GBs there).
  find "$CACHE" -maxdepth 1 -name "$name-*.oci.tar*" -exec rm -rf {} +
  buildah_ rmi -f "${refs[@]}" >/dev/null 2>&1 || true
  buildah_ rmi --prune >/dev/null 2>&1 || true
  if [ "$target" = trainer ]; then
    drop_node_store
    need_space "$TRAINER_BUILD_GB" "building $ref and $GUEST_REF (torch's CUDA wheels installed, committed and archived)"
  fi
  local -a args=(-v "$CA_BUNDLE:$CA_BUNDLE:ro")
  # Only the trainer installs torch (from TORCH_INDEX_URL=file:///mnt/simple).
  [ "$target" != trainer ] || args+=(-v "$WHEELS:/mnt:ro")
  for arg in "$@"; do args+=(--build-arg "$arg"); done
  log "building $ref (--target $target $*)"
  # Docker format, as `docker build` makes: in OCI format buildah 1.28 ignores the Dockerfile's
  # SHELL and runs RUN steps with /bin/sh. The archive is converted to OCI on push.
  buildah_ bud --format docker --pull=never --isolation chroot --network host --layers=false \
    --force-rm --target "$target" -t "$ref" "${args[@]}" -f "$DOCKERFILE" "$ROOT" >&2
  log "$ref: built in $((SECONDS - t0)) s"
  [ "$target" != trainer ] || build_guest
  local built=$SECONDS
  archive_image "$archive" "${refs[@]}"
  log "${refs[*]}: archived in $((SECONDS - built)) s, $(du -h "$archive" | cut -f1) $archive"
  echo "$archive"
}

# build_guest: the guest image, one layer on the trainer just built (tests/cluster/guest.Dockerfile).
# Its RUN needs no network (its wheels are at /mnt) and the build context is empty (it copies
# nothing); the other flags are the trainer's, for the same reasons.
build_guest() {
  local t0=$SECONDS context=$TMPDIR/guest-context
  mkdir -p "$context"
  log "building $GUEST_REF: one layer on $TRAINER_REF with ${FRAMEWORKS[*]}, without kubetrain and pydantic"
  buildah_ bud --format docker --pull=never --isolation chroot --network host --layers=false \
    --force-rm -t "$GUEST_REF" -v "$FRAMEWORK_WHEELS:/mnt:ro" --build-arg "TRAINER_IMAGE=$TRAINER_REF" \
    --build-arg "FRAMEWORKS=${FRAMEWORKS[*]}" -f "$GUEST_DOCKERFILE" "$context" >&2
  log "$GUEST_REF: built in $((SECONDS - t0)) s"
}

# archive_image ARCHIVE REF...: an OCI layout in a tar holding each REF under its name (containerd's
# import name; one import brings them all), and the images out of buildah's storage. Images pushed
# into one layout share its blobs: the guest adds its own layer, config and manifest only. The
# layout is written as a directory and the storage copies are removed before the tar is made: at
# most two copies of the trainer's GBs exist at once (an oci-archive: push holds three). Layers are
# gzip level 0 (stored): buildah 1.28 ignores --disable-compression for OCI destinations, and real
# gzip of the trainer costs ~5 minutes here.
archive_image() {
  local archive=$1 layout=$1.d ref before
  shift
  for ref in "$@"; do
    before=0
    [ ! -d "$layout" ] || before=$(du -sb "$layout" | cut -f1)
    buildah_ push --format oci --compression-level 0 "$ref" "oci:$layout:$ref" >&2
    log "$ref: pushed, adds $((($(du -sb "$layout" | cut -f1) - before) / 1024 / 1024)) MiB to the layout"
  done
  buildah_ rmi "$@" >/dev/null
  buildah_ rmi --prune >/dev/null 2>&1 || true
  tar -C "$layout" -cf "$archive.partial" oci-layout index.json blobs
  rm -rf "$layout"
  mv "$archive.partial" "$archive"
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
  GUEST_RECIPE=$(guest_recipe)
  local base_name=${BASE_REF#docker.io/library/} operator trainer
  if [ "$MODE" = build ]; then
    [ "$(id -u)" -eq 0 ] || die "needs root (buildah, debootstrap, chroot)"
    mkdir -p "$CACHE"
    # One build at a time owns the storage, so an interrupted build's working containers (which
    # --force-rm cannot reach) are removed on exit without touching another build's.
    exec 9>"$CACHE/.lock"
    flock 9
    trap 'buildah_ rm --all >/dev/null 2>&1 || true' EXIT
    # buildah's temporary copies of a layer (GBs for the trainer) stay in the cache, where an
    # interrupted push's leftovers are found and removed by the next run.
    export TMPDIR=$CACHE/tmp
    rm -rf "$TMPDIR"
    mkdir -p "$TMPDIR"
    install_tools
    ensure_base
    ensure_wheels
    ensure_framework_wheels
  fi
  operator=$(build_image operator "$OPERATOR_REF" operator)
  trainer=$(build_image trainer-cpu "$TRAINER_REF" trainer \
    "TRAINER_BASE=$base_name" "TORCH_INDEX_URL=file:///mnt/simple")
  [ "$MODE" = print ] || log "done; cache $(du -shx "$CACHE" | cut -f1) in $CACHE"
  echo "OPERATOR_IMAGE_ARCHIVE=$operator"
  echo "TRAINER_IMAGE_ARCHIVE=$trainer"
  echo "GUEST_IMAGE_ARCHIVE=$trainer"
}

install_tools() {
  command -v buildah >/dev/null && command -v debootstrap >/dev/null && return
  log "installing buildah and debootstrap (Debian packages)"
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    buildah debootstrap >&2
}

main "$@"
