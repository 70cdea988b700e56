# One image for both services: `rankecho serve` (Echo, StatefulSet) and `rankecho agent` (DaemonSet).
# The agent needs Debian's bcc bindings and gcc-free BPF compilation uses the host's kernel headers
# (mounted by the Helm chart at /lib/modules and /usr/src).
FROM debian:12-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-bpfcc ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/rankecho
COPY pyproject.toml README.md ./
COPY rankecho ./rankecho
COPY shared ./shared
COPY echo ./echo
COPY agent ./agent
COPY sim ./sim
COPY bench ./bench

# --system-site-packages lets the venv import Debian's bcc (pure Python over libbcc.so.0).
RUN python3 -m venv --system-site-packages /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir . \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin rankecho

ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
# Echo runs as uid 10001 (the chart sets it); the agent's pod runs as root for eBPF.
ENTRYPOINT ["rankecho"]
CMD ["--help"]
