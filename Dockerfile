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
COPY runtime/ runtime/
COPY trainer/ trainer/
COPY cli/ cli/
COPY client/ client/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- requirements: what each image installs besides kubetrain's own code, read from pyproject ----
# Kept apart from the code so that a change to kubetrain's Python leaves the layers below it as they
# were (a builder's layer cache keys COPY --from by content): only pyproject's dependency lists
# decide them. Self-references (`kubetrain[cli]`) are left out; the extras they name are listed.
FROM ${PYTHON_BASE} AS requirements
WORKDIR /src
COPY pyproject.toml ./
RUN python -c "import tomllib; project = tomllib.load(open('pyproject.toml', 'rb'))['project']; extras = project['optional-dependencies']; lists = {'trainer': ['worker'], 'operator': ['operator', 'cli']}; [open(f'/requirements-{image}.txt', 'w').write(''.join(r + chr(10) for r in project['dependencies'] + [r for extra in names for r in extras[extra] if not r.startswith('kubetrain')])) for image, names in lists.items()]"

# --- operator-deps: a virtualenv with kopf and the kubernetes client (no torch), no kubetrain -----
FROM ${PYTHON_BASE} AS operator-deps
LABEL org.opencontainers.image.title="kubetrain-operator" \
      org.opencontainers.image.description="The kubetrain TrainingJob operator (kopf)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=requirements /requirements-operator.txt /tmp/requirements.txt
RUN python -m venv /opt/venv \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && groupadd --gid 10001 kubetrain \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin kubetrain

# --- operator: kubetrain on operator-deps ---------------------------------------------------
FROM operator-deps AS operator
COPY --from=wheel /wheels /tmp/wheels
# The operator extra finds its dependencies installed below: pip installs kubetrain alone. The
# wheel's file name is not known in advance; `set --` expands it without ls.
# DL3013 reads "$1[operator]" as an unpinned package; it is the wheel built above.
# hadolint ignore=DL3013
RUN set -- /tmp/wheels/kubetrain-*.whl \
    && pip install --no-cache-dir "$1[operator]" \
    && rm -rf /tmp/wheels
USER 10001:10001
# 8000: Prometheus metrics; 8080: kopf's liveness endpoint (/healthz).
EXPOSE 8000 8080
ENTRYPOINT ["kubetrain"]
CMD ["operator"]

# --- trainer-deps: torch and the trainer's other dependencies, none of kubetrain's code ----------
# Its layers change with the pins only (TORCH_VERSION, pyproject's lists): the GBs of torch are
# built, moved and imported once, and a change to kubetrain's Python rebuilds the stage below.
FROM ${TRAINER_BASE} AS trainer-deps
ARG TORCH_VERSION
ARG TORCH_INDEX_URL
LABEL org.opencontainers.image.title="kubetrain-trainer" \
      org.opencontainers.image.description="torchrun + the kubetrain DDP trainer" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/kubetrain
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=requirements /requirements-trainer.txt /tmp/requirements.txt
# torch first, from its index, so the requirements find it satisfied and pull no other build.
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}" \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
RUN groupadd --gid 10001 kubetrain \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/kubetrain \
       --shell /bin/bash kubetrain
# Relative paths in a TrainingJob's command (e.g. `torchrun examples/byo_train.py`) resolve here.
WORKDIR /opt/kubetrain

# --- trainer: kubetrain on trainer-deps, the default pod command works ---------------------------
FROM trainer-deps AS trainer
COPY --from=wheel /wheels /tmp/wheels
# The worker extra finds its dependencies installed below: pip installs kubetrain alone.
# The .pth loads kubetrain.runtime.torchrun_hooks in every Python of the image (inert until
# torch.distributed is imported): clean exits for any script under torchrun, unmodified.
# DL3013 reads "$1[worker]" as an unpinned package; it is the wheel built above.
# hadolint ignore=DL3013
RUN set -- /tmp/wheels/kubetrain-*.whl \
    && pip install --no-cache-dir "$1[worker]" \
    && rm -rf /tmp/wheels \
    && echo "import kubetrain.runtime.torchrun_hooks" \
       > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kubetrain-torchrun-hooks.pth" \
    && python -c "import sys, torch, kubetrain.trainer; assert 'kubetrain.runtime.torchrun_hooks' in sys.modules; print('torch', torch.__version__)" \
    && command -v torchrun
COPY examples/ examples/
USER 10001:10001
# The operator sets the command of every pod; this is the same default, for `docker run`.
CMD ["torchrun", "-m", "kubetrain.trainer", "train"]
