# pitcrew's image: one process serving the webhook, the API, /metrics and the engine.
#
#   docker build -t pitcrew .                      # default: REST-only (slurm.backend: rest), no Slurm client
#   docker build --target scontrol -t pitcrew:scontrol .   # adds scontrol/squeue for slurm.backend: scontrol
#
# Stages: `build` makes the wheel and installs it into a venv at /opt/pitcrew; `runtime` copies
# only that venv onto the same slim base with Debian's python3 (no pip, no compiler, no apt
# lists); `scontrol` adds Slurm's client commands; `rest`, the last and so the default target,
# is `runtime` as it is.
# tests/packaging/test_image.py runs the build stage's commands without a Docker engine.
#
# Base: Debian 12.12 slim, pinned by tag and digest (the image's interpreter is Debian's
# python3 3.11, which apt keeps patched). Debian package versions are not pinned: the base
# digest fixes the starting point and security updates must still land. Both FROM lines name the
# same base (a build ARG would hide the pin from linters).
FROM debian:12.12-slim@sha256:d5d3f9c23164ea16f31852f95bd5959aad1c5e854332fe00f7b3a20fcc9f635c AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bot ./bot
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /dist /src \
 && python3 -m venv /opt/pitcrew \
 && /opt/pitcrew/bin/pip install --no-cache-dir /dist/pitcrew-*.whl \
 && /opt/pitcrew/bin/pip uninstall --yes pip setuptools \
 && /opt/pitcrew/bin/pitcrew --version

FROM debian:12.12-slim@sha256:d5d3f9c23164ea16f31852f95bd5959aad1c5e854332fe00f7b3a20fcc9f635c AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
# Where this image was built from (docker build --build-arg SOURCE=<repository URL>): no address is assumed.
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="pitcrew" \
      org.opencontainers.image.description="GPU died. Training didn't. Heals Slurm-on-Kubernetes GPU nodes from Alertmanager alerts." \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="docker.io/library/debian:12.12-slim"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# python3 without Recommends brings neither pip nor a compiler.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 pitcrew \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/pitcrew --shell /usr/sbin/nologin pitcrew \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/pitcrew
COPY --from=build /opt/pitcrew /opt/pitcrew
# XDG_STATE_HOME puts the default store at /var/lib/pitcrew/pitcrew.db (the volume); no PITCREW_*
# variable is set here, since those would override the mounted configuration file.
ENV PATH=/opt/pitcrew/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    XDG_STATE_HOME=/var/lib
WORKDIR /var/lib/pitcrew
USER 10001:10001
EXPOSE 9095
# Kubernetes probes /healthz and /readyz (deploy/kubernetes/deployment.yaml); Docker's HEALTHCHECK
# is ignored there and would need the configured listen address baked in.
# checkov:skip=CKV_DOCKER_2: liveness and readiness are the Deployment's httpGet probes on /healthz and /readyz
ENTRYPOINT ["pitcrew"]
CMD ["serve"]

# slurm.backend: scontrol needs Slurm's client commands and libmunge; slurm.conf and the munge
# socket (/run/munge, from a munged sidecar) are mounted at run time.
FROM runtime AS scontrol
USER 0
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends slurm-client \
 && rm -rf /var/lib/apt/lists/*
USER 10001:10001

# The default target: REST-only (slurm.backend: rest against slurmrestd v0.0.39 or newer; older
# servers and job requeue need the scontrol target).
FROM runtime AS rest
