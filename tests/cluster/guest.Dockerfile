# The guest image: a user's own image the way their platform team builds it, torch plus Hugging Face
# transformers (and accelerate, which its Trainer needs) and Lightning, with nothing of kubetrain and
# neither pydantic nor pydantic-core. The real-node tests run users' scripts in it, so whatever
# kubetrain needs in such a pod must be what it injects at run time, stdlib-only.
#
# tests/cluster/build-images.sh builds it FROM the trainer's dependency stage (`--target
# trainer-deps`: torch, numpy, scikit-learn, obstore, pydantic; no kubetrain), so it follows the
# pins, not kubetrain's code: one RUN, one layer (LABEL, USER and CMD only touch the config) on the
# layers the trainer image has under its own, which the node holds once.
#   FRAMEWORKS  the [dev] extra's pins in pyproject.toml (transformers, accelerate, lightning)
#   /mnt        the script's wheel cache of them with a PEP 503 index (simple/), bind-mounted
#               read-only for the RUN only: no PyPI, and nothing of the mount stays in the layer
ARG DEPS_IMAGE=docker.io/kubetrain/trainer-deps:0.1.0-cpu
FROM ${DEPS_IMAGE}
ARG FRAMEWORKS
LABEL org.opencontainers.image.title="kubetrain-test-guest" \
      org.opencontainers.image.description="torch, transformers, accelerate and Lightning; no kubetrain (tests only)"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The frameworks go in first, while pydantic (a kubetrain dependency the stage below installs) is
# still there: transformers needs typer, which names pydantic, and pip checks the dependencies of
# installed packages too, so installing after the uninstall would bring pydantic back. pip skips
# what the stage has (torch, numpy, ...). Then pydantic and pydantic-core go. typer stays, unusable
# without pydantic: transformers imports it for its CLI only. The stage runs as root (its USER is
# the trainer's, set above it), so the RUN may write /usr/local.
# DL3013 reads $FRAMEWORKS (unquoted: a word per pin) as unpinned; they are the [dev] extra's pins.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --index-url file:///mnt/simple $FRAMEWORKS \
    && purelib=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
    && pip uninstall -y pydantic pydantic-core \
    && if python -c "import kubetrain" 2>/dev/null; then echo "kubetrain still imports" >&2; exit 1; fi \
    && if python -c "import pydantic" 2>/dev/null; then echo "pydantic still imports" >&2; exit 1; fi \
    && leftovers=$(find "$purelib" -iname '*kubetrain*') \
    && if [ -n "$leftovers" ]; then echo "left in $purelib: $leftovers" >&2; exit 1; fi \
    && python -c "import sys, torch, transformers, accelerate, lightning; assert not [m for m in sys.modules if m.startswith(('kubetrain', 'pydantic'))]; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'lightning', lightning.__version__)"
USER 10001:10001
# WORKDIR stays the stage's /opt/kubetrain, empty here: the tests mount their scripts at /workloads.
CMD ["python"]
