#!/usr/bin/env bash
# Install the npm packages the interop tests drive (tests/interop/package.json, pinned by its lock file):
# OpenTelemetry JS SDK exporters, MCP Inspector, and a Node 22 binary package for the Inspector.
# Never fails the build: when npm or the registry is missing, the reason goes to tests/interop/.install-failed
# and tests/test_interop_*.py skip with that reason.
set -uo pipefail
cd "$(dirname "$0")/../tests/interop"
say() { echo "setup-interop: $*" >&2; }
rm -f .install-failed

if ! command -v npm >/dev/null 2>&1; then
  echo "npm is not installed: run 'make install' as root on Debian (scripts/setup-host.sh installs nodejs and npm), or install Node.js >= 18.19 with npm" > .install-failed
  say "$(cat .install-failed)"
  exit 0
fi
if [ -f node_modules/.package-lock.json ] && cmp -s package-lock.json .installed-lock 2>/dev/null; then
  exit 0  # already installed from this lock file
fi
say "installing the interop clients (npm ci in tests/interop)"
if npm ci --ignore-scripts --no-audit --no-fund --loglevel=error > npm-ci.log 2>&1; then
  cp package-lock.json .installed-lock
  rm -f npm-ci.log
else
  { echo "npm ci in tests/interop failed (npm $(npm --version 2>/dev/null), node $(node --version 2>/dev/null)):"; tail -n 5 npm-ci.log; } > .install-failed
  say "$(cat .install-failed)"
fi
exit 0
