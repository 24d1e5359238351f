# syntax=docker/dockerfile:1
# Operator image: `kopf run -m rtj.handlers`. Installs `.[operator]` only (no torch, no NVRx) and only the
# `rtj` package (operator/; rtj_trainer and rtj_local are not copied, and pyproject's package discovery
# finds only what is there).
#   docker build -t rtj-operator:0.1.0 .
# (`make images` builds it here with podman: docs/development.md, "Images and real kubelet nodes".)
# Runs as UID 65532 with a read-only root filesystem (the chart mounts an emptyDir at /tmp).

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Optional: a CA bundle for pip behind a TLS-intercepting proxy, mounted by the build (never in the image).
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, from pyproject.toml's pins alone: editing the code reuses this layer.
COPY pyproject.toml hack/pyproject_requirements.py ./
RUN python pyproject_requirements.py --build-system --extra operator >requirements.txt \
    && /opt/venv/bin/pip install -r requirements.txt
# Then our code, without touching the dependencies.
COPY README.md ./
COPY operator/ operator/
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation . \
    && /opt/venv/bin/python -c "import rtj.handlers, importlib.util as u; assert not u.find_spec('rtj_local')" \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="resilient-training-operator" \
      org.opencontainers.image.description="Kubernetes operator keeping PyTorch training jobs alive through faults" \
      org.opencontainers.image.licenses="Apache-2.0"
# Bytecode was compiled at build time; nothing is written to the (read-only) root filesystem at run time.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# A numeric non-root user, so that runAsNonRoot can verify it without /etc/passwd; it has a passwd entry
# all the same, because kopf names its peering identity after getpass.getuser() (it crashed without one).
RUN groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin nonroot
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 9090
# The chart passes the arguments (liveness port, namespaces, log format); these are the defaults.
ENTRYPOINT ["kopf", "run"]
CMD ["--standalone", "--liveness=http://0.0.0.0:8080/healthz", "--all-namespaces", "-m", "rtj.handlers"]
