#!/usr/bin/env bash
# Let a virtual environment import Debian's bcc bindings (pure Python over libbcc.so.0)
# without exposing the rest of /usr/lib/python3/dist-packages.
set -euo pipefail
venv=${1:?usage: link-bcc.sh VENV}
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
src=/usr/lib/python3/dist-packages/bcc
if [ ! -d "$src" ]; then
  echo "link-bcc: $src not found; eBPF features need python3-bpfcc (scripts/setup-host.sh installs it)" >&2
  exit 0
fi
mkdir -p "$site/_rankecho_bcc"
ln -sfn "$src" "$site/_rankecho_bcc/bcc"
echo "$site/_rankecho_bcc" > "$site/rankecho-bcc.pth"
