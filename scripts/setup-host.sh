#!/usr/bin/env bash
# Prepare a Debian host for rankecho: bcc, kernel headers bcc can compile against, tracefs, and Node.js
# with npm (the interop tests run OpenTelemetry JS exporters and MCP Inspector: scripts/setup-interop.sh),
# podman and debootstrap (scripts/build-image.sh builds the container image from Debian's archive; the
# image tests build and run it), chromium (the report is opened in a real headless browser) and
# prometheus (its promtool checks the chart's alert rules).
# Idempotent and quick when everything is in place. Without root it only reports what is missing.
set -euo pipefail

APT_PACKAGES=(python3-bpfcc bpfcc-tools linux-headers-cloud-amd64 gcc make podman debootstrap chromium
  prometheus)

say() { echo "setup-host: $*" >&2; }

missing_packages() {
  local p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"
  done
}

if ! command -v dpkg-query >/dev/null 2>&1; then
  say "not a Debian host: install bcc (python3 bindings), gcc, make and kernel headers by hand"
  exit 0
fi

mapfile -t missing < <(missing_packages)
# Node.js may come from elsewhere (nodesource, nvm): ask apt for it only when no node/npm is on PATH.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    say "missing packages: ${missing[*]}; run as root: apt-get install -y ${missing[*]}"
    exit 0
  fi
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q "${missing[@]}" >/dev/null
fi

[ "$(id -u)" -eq 0 ] || { say "not root: skipping kernel-header links and tracefs mount"; exit 0; }

# The running kernel may ship no headers; bcc only needs some at BPF compile time.
# Debian splits them into an arch dir (build) and a common dir (source): link both.
moddir="/lib/modules/$(uname -r)"
if [ ! -e "$moddir/build/include" ] || [ ! -e "$moddir/source/include" ]; then
  arch_dir=$(ls -d /usr/src/linux-headers-*-cloud-amd64 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$arch_dir" ]; then
    say "no /usr/src/linux-headers-*-cloud-amd64; install linux-headers-cloud-amd64"
    exit 1
  fi
  common_dir="${arch_dir%-cloud-amd64}-common"
  mkdir -p "$moddir"
  ln -sfn "$arch_dir" "$moddir/build"
  ln -sfn "$common_dir" "$moddir/source"
  say "linked $moddir/build -> $arch_dir and source -> $common_dir"
fi

if [ -d /sys/kernel/tracing ] && [ -z "$(ls -A /sys/kernel/tracing 2>/dev/null)" ]; then
  mount -t tracefs nodev /sys/kernel/tracing && say "mounted tracefs on /sys/kernel/tracing"
fi
exit 0
