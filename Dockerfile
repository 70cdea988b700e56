# One image for both services: `rankecho serve` (Echo, StatefulSet, uid 10001) and `rankecho agent`
# (DaemonSet, root for eBPF). Build it with scripts/build-image.sh (docs/deploy.md).
#
# Two stages: the build stage installs rankecho from the source tree into a virtual environment (the
# wheel setuptools builds there holds real copies of the packages that rankecho/ links to: agent/,
# echo/, shared/, sim/, stress/); the runtime stage receives only that venv, so no source tree, build
# tool or pip configuration reaches the image. bench/, scripts/ and tests/ are never copied
# (.dockerignore lets through only what the wheel needs).
ARG BASE=debian:12-slim

FROM ${BASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
# rankecho/ holds links (rankecho/echo -> ../echo, ...): the directories they point at go beside it.
COPY rankecho ./rankecho
COPY agent ./agent
COPY echo ./echo
COPY shared ./shared
COPY sim ./sim
COPY stress ./stress
# Where PyPI is reached through a mirror or a proxy with its own CA (scripts/build-image.sh passes the
# host's settings); these exist only in this stage.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_CERT
ARG PIP_DEFAULT_TIMEOUT=60
# --system-site-packages lets the venv import Debian's bcc (pure Python over libbcc.so.0), installed in
# the runtime stage. The import check fails the build here, not the pod at start.
RUN python3 -m venv --system-site-packages /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check . \
 && cd / && /opt/venv/bin/rankecho --version

FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-bpfcc ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin rankecho \
 && mkdir -p /data /lib/modules \
 && chown 10001:10001 /data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
# /data: Echo's store (the chart mounts its volume there; `-v DIR:/data` elsewhere). /lib/modules and
# /usr/src: where the agent's pod mounts the host's kernel headers for bcc.
# Non-root by default: Echo runs as uid 10001 (the chart sets it too); the agent's pod sets runAsUser 0
# for eBPF.
USER 10001:10001
ENTRYPOINT ["rankecho"]
CMD ["--help"]
