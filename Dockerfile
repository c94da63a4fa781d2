# syntax=docker/dockerfile:1
# The cancel-bus node image: `cancel-bus serve` on a slim Python, as a non-root user, ready for a
# read-only root filesystem (only /tmp needs to be writable; the Helm chart mounts an emptyDir).
#
# The install step is the one CI runs (scripts/_venv.sh: uv, bootstrapped from PyPI by the hashes
# uv.lock pins, then `uv sync --locked` into a virtualenv), minus the editable flag, the tools and
# the test extras: the image holds the package and exactly the versions CI tested, nothing else.
# Not built on the project's machines (they have no Docker engine); see docs/deploy.md,
# "What is not verified".
#   docker build -t cancel-bus:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- build: a virtualenv with the package and its dependencies (wheels; no compiler needed) ------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 UV_NO_CACHE=1 UV_PYTHON_DOWNLOADS=never
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY scripts/locked_uv.py ./scripts/
COPY cancel_bus ./cancel_bus
COPY node ./node
RUN python -m venv /opt/uv \
    && python scripts/locked_uv.py > /tmp/uv.txt \
    && /opt/uv/bin/python -m pip install --quiet --no-deps --require-hashes -r /tmp/uv.txt \
    && python -m venv --without-pip /opt/cancel-bus \
    && UV_PROJECT_ENVIRONMENT=/opt/cancel-bus /opt/uv/bin/uv sync --locked --quiet --extra node --extra otel --no-dev --no-editable

# -- runtime: the virtualenv only; no pip in it, no build tools, no sources ----------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="cancel-bus" \
      org.opencontainers.image.description="Cancel long-running agent runs from any replica" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/cancel-bus/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CANCEL_BUS_HOST=0.0.0.0
RUN groupadd --system --gid 10001 cancel-bus \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/cancel-bus --create-home \
       --shell /usr/sbin/nologin cancel-bus
COPY --from=build /opt/cancel-bus /opt/cancel-bus
# Numeric, so Kubernetes' runAsNonRoot can check it (the chart's podSecurityContext uses 10001).
USER 10001:10001
WORKDIR /home/cancel-bus
EXPOSE 8080
# Docker and Compose use this; Kubernetes ignores it and probes /healthz and /readyz itself.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CANCEL_BUS_PORT', '8080'), timeout=2)"]
# A node with auth off (no API tokens) refuses a non-loopback address unless CANCEL_BUS_INSECURE_NO_AUTH is set.
ENTRYPOINT ["cancel-bus"]
CMD ["serve"]
