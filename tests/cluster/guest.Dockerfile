# The guest image: a user's own image the way their platform team builds it, torch plus Hugging Face
# transformers (and accelerate, which its Trainer needs) and Lightning, with nothing of kubetrain and
# neither pydantic nor pydantic-core. The real-node tests run users' scripts in it, so whatever
# kubetrain needs in such a pod must be what it injects at run time, stdlib-only.
#
# tests/cluster/build-images.sh builds it right after the trainer image, FROM that image: one RUN,
# and buildah's --layers=false commits a stage as one layer (LABEL, USER and CMD only touch the
# config), so the guest costs that one layer on disk and in the archive it shares with the trainer.
#   FRAMEWORKS  the [dev] extra's pins in pyproject.toml (transformers, accelerate, lightning)
#   /mnt        the script's wheel cache of them with a PEP 503 index (simple/), bind-mounted
#               read-only for the RUN only: no PyPI, and nothing of the mount stays in the layer
ARG TRAINER_IMAGE=docker.io/kubetrain/trainer:0.1.0-cpu
FROM ${TRAINER_IMAGE}
ARG FRAMEWORKS
LABEL org.opencontainers.image.title="kubetrain-test-guest" \
      org.opencontainers.image.description="torch, transformers, accelerate and Lightning; no kubetrain (tests only)"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The trainer runs as 10001, which cannot write /usr/local: root for the RUN, 10001 again below.
USER 0:0
# The frameworks go in first, while kubetrain's pydantic is still installed: transformers needs
# typer, which names pydantic, and pip checks the dependencies of installed packages too, so
# installing after the uninstall would bring pydantic back. pip skips what the trainer has (torch,
# numpy, ...). Then kubetrain (its package, the `kubetrain` script), pydantic and pydantic-core go,
# and the .pth the trainer's Dockerfile wrote (it imports kubetrain.trainer.torchrun_hooks at every
# start). typer stays, unusable without pydantic: transformers imports it for its CLI only. pip
# leaves kubetrain's own directory behind, empty (kubetrain has no __init__.py, its subpackages
# went), and an empty directory on sys.path still imports as a namespace package: it goes too.
# DL3013 reads $FRAMEWORKS (unquoted: a word per pin) as unpinned; they are the [dev] extra's pins.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --index-url file:///mnt/simple $FRAMEWORKS \
    && purelib=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
    && pip uninstall -y kubetrain pydantic pydantic-core \
    && rm "$purelib/kubetrain-torchrun-hooks.pth" \
    && find "$purelib" -maxdepth 1 -name kubetrain -type d -empty -delete \
    && if python -c "import kubetrain" 2>/dev/null; then echo "kubetrain still imports" >&2; exit 1; fi \
    && if python -c "import pydantic" 2>/dev/null; then echo "pydantic still imports" >&2; exit 1; fi \
    && leftovers=$(find "$purelib" -iname '*kubetrain*') \
    && if [ -n "$leftovers" ]; then echo "left in $purelib: $leftovers" >&2; exit 1; fi \
    && python -c "import sys, torch, transformers, accelerate, lightning; assert not [m for m in sys.modules if m.startswith(('kubetrain', 'pydantic'))]; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'lightning', lightning.__version__)"
USER 10001:10001
# WORKDIR stays the trainer's /opt/kubetrain (its examples/ are the users' scripts the tests run).
# The trainer's default command runs kubetrain's trainer, absent here; a pod's command replaces it.
CMD ["python"]
