# syntax=docker/dockerfile:1
# Two images from one file:
#   docker build --target operator -t kubetrain/operator:0.1.0 .
#   docker build --target trainer  -t kubetrain/trainer:0.1.0 .                      # CUDA + NCCL
#   docker build --target trainer  -t kubetrain/trainer:0.1.0-cpu \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .              # CPU only
# Both run as the numeric non-root user 10001 (the restricted Pod Security Standard checks
# runAsNonRoot against a numeric UID). Plain `docker build` works: no BuildKit-only syntax.

# The operator's base and the wheel builder's: any Python >= 3.11.
ARG PYTHON_BASE=python:3.11-slim-bookworm
# The trainer's base: the same Python; torch comes from TORCH_INDEX_URL at TORCH_VERSION.
ARG TRAINER_BASE=python:3.11-slim-bookworm
# The torch the tests run (pyproject's dev extra pins the same version; tests/deploy checks
# that the two and the tests' own torch agree): the image ships what was tested.
ARG TORCH_VERSION=2.15.0
# PyPI's Linux wheel is the CUDA build, with its CUDA, cuDNN and NCCL libraries as wheels;
# https://download.pytorch.org/whl/cpu gives the CPU build (the `-cpu` tag).
ARG TORCH_INDEX_URL=https://pypi.org/simple

# --- wheel: the kubetrain package, built once for both images ---------------------------------
FROM ${PYTHON_BASE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api/ api/
COPY operator/ operator/
COPY local/ local/
COPY trainer/ trainer/
COPY cli/ cli/
COPY client/ client/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- operator: kopf + kubernetes client, no torch ---------------------------------------------
FROM ${PYTHON_BASE} AS operator-venv
COPY --from=wheel /wheels /wheels
# A virtualenv so the final stage copies exactly the installed packages, nothing of the build.
# The wheel's file name is not known in advance; `set --` expands it without ls.
RUN python -m venv /opt/venv \
    && set -- /wheels/kubetrain-*.whl \
    && /opt/venv/bin/pip install --no-cache-dir "$1[operator]"

FROM ${PYTHON_BASE} AS operator
LABEL org.opencontainers.image.title="kubetrain-operator" \
      org.opencontainers.image.description="The kubetrain TrainingJob operator (kopf)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=operator-venv /opt/venv /opt/venv
RUN groupadd --gid 10001 kubetrain \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin kubetrain
USER 10001:10001
# 8000: Prometheus metrics; 8080: kopf's liveness endpoint (/healthz).
EXPOSE 8000 8080
ENTRYPOINT ["kubetrain"]
CMD ["operator"]

# --- trainer: torch + the built-in trainer, the default pod command works ---------------------
FROM ${TRAINER_BASE} AS trainer
ARG TORCH_VERSION
ARG TORCH_INDEX_URL
LABEL org.opencontainers.image.title="kubetrain-trainer" \
      org.opencontainers.image.description="torchrun + the kubetrain DDP trainer" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/kubetrain
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=wheel /wheels /tmp/wheels
# torch first, from its index, so the worker extra finds it satisfied and pulls no other build.
# The .pth loads kubetrain.trainer.torchrun_hooks in every Python of the image (inert until
# torch.distributed is imported): clean exits for any script under torchrun, unmodified.
# DL3013 reads "$1[worker]" as an unpinned package; it is the wheel built above.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}" \
    && set -- /tmp/wheels/kubetrain-*.whl \
    && pip install --no-cache-dir "$1[worker]" \
    && rm -rf /tmp/wheels \
    && echo "import kubetrain.trainer.torchrun_hooks" \
       > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kubetrain-torchrun-hooks.pth" \
    && python -c "import sys, torch, kubetrain.trainer; assert 'kubetrain.trainer.torchrun_hooks' in sys.modules; print('torch', torch.__version__)" \
    && command -v torchrun
RUN groupadd --gid 10001 kubetrain \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/kubetrain \
       --shell /bin/bash kubetrain
# Relative paths in a TrainingJob's command (e.g. `torchrun examples/byo_train.py`) resolve here.
WORKDIR /opt/kubetrain
COPY examples/ examples/
USER 10001:10001
# The operator sets the command of every pod; this is the same default, for `docker run`.
CMD ["torchrun", "-m", "kubetrain.trainer", "train"]
