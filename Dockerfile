# syntax=docker/dockerfile:1
#
# Hoard, the S3 caching gateway, as a container image.
#
#   docker build -t hoard:local .
#   docker run --rm -p 9000:9000 -v hoard-cache:/var/cache/hoard \
#     -v "$PWD/my-hoard.yaml:/etc/hoard/hoard.yaml:ro" hoard:local
#
# Two stages: the builder turns Hoard and every dependency into wheels (it has
# pip's build machinery and network access); the final stage installs only
# those wheels, offline, and runs as an unprivileged user. The image's default
# config is the documented example (config/hoard.yaml); mount your own over
# /etc/hoard/hoard.yaml, or override single keys with HOARD_<KEY> variables.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# A C compiler for the hit path's compiled twins, and OpenSSL's headers for the one
# that hashes with its SHA-256 (setup.py; Cython comes from
# pyproject.toml's build requirements). The final stage gets the built wheel only.
# Not pinned: the base image fixes the Debian release, and a pinned point version
# disappears from its mirrors at the next security update, breaking the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# pyproject.toml names README.md as the package's long description.
COPY pyproject.toml setup.py README.md ./
COPY gateway ./gateway
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A fixed uid/gid (10001), named numerically in USER below so Kubernetes'
# runAsNonRoot can verify it, and so runAsUser/fsGroup and volume ownership
# agree with the image.
RUN groupadd --system --gid 10001 hoard \
    && useradd --system --uid 10001 --gid hoard --no-create-home \
       --home-dir /var/cache/hoard --shell /usr/sbin/nologin hoard \
    && mkdir -p /var/cache/hoard /etc/hoard \
    && chown hoard:hoard /var/cache/hoard
# Only wheels built above: no compiler, no index, nothing fetched at this stage.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/*.whl
COPY config/hoard.yaml /etc/hoard/hoard.yaml

USER 10001:10001
WORKDIR /var/cache/hoard
# The block cache and metadata store: mount fast local disk (NVMe) here.
VOLUME ["/var/cache/hoard"]
EXPOSE 9000
# python's urllib, so the image needs no curl. The port is the one the configs
# in this repository listen on (listen: 0.0.0.0:9000).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9000/_hoard/health', timeout=4)"]

ENTRYPOINT ["python", "-m", "gateway"]
CMD ["serve", "--config", "/etc/hoard/hoard.yaml"]
