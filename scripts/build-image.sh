#!/usr/bin/env bash
# Build (and optionally push) the rankecho container image from the Dockerfile; docs/deploy.md.
#
#   scripts/build-image.sh [--tag IMAGE] [--engine podman|docker] [--debootstrap] [--chroot] [--push REF]
#   scripts/build-image.sh run-chroot IMAGE [--user UID:GID] [--volume HOST:DEST]... [--env NAME[=VALUE]]...
#                                     -- COMMAND [ARG]...
#
# build (the default):
#   --tag IMAGE     local name of the image (default rankecho:<version from rankecho/__init__.py>)
#   --engine E      podman or docker (default: podman if on PATH, else docker)
#   --debootstrap   make the base image debian:12-slim from Debian's archive with debootstrap instead of
#                   pulling it from a container registry (for hosts that reach only Debian and PyPI).
#                   The rootfs tarball is cached per day under build/image/; imported as
#                   localhost/debian:12-slim. Needs root, debootstrap and podman.
#   --chroot        podman build --isolation=chroot --network=host: for hosts (e.g. inside a container)
#                   where podman cannot start OCI containers or set up their network.
#   --push REF      tag the image as REF (registry/repository:tag) and push it; prints the digest to pin
#                   in the chart (image.digest).
# With podman, the host's pip configuration (/etc/pip.conf, ~/.config/pip/pip.conf, PIP_INDEX_URL,
# PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST) and CA file (PIP_CERT, else SSL_CERT_FILE, else
# /etc/ssl/certs/ca-certificates.crt) reach pip in the build stage only, so a mirror or a TLS-inspecting
# proxy works; none of it ends up in the image.
#
# run-chroot: run a command from the image without a container runtime (where `podman run` fails, e.g.
# on RLIMIT_NOFILE inside a container): `podman image mount` + chroot in a private mount namespace with
# /proc, /sys and /dev from the host, a fresh tmpfs on /tmp, the image's environment (plus --env) and
# user (unless --user), like `podman run`; the host's network. Needs root. The process keeps this
# script's PID, so signals reach it directly.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${RANKECHO_IMAGE_CACHE:-$ROOT/build/image}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_IMAGE=localhost/debian:12-slim

say() { echo "build-image: $*" >&2; }
die() { say "$*"; exit 2; }
# The header above; on stdout for --help, on stderr (exit 2) after a usage error.
usage() {
  local code=${1:-2}
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&$((code == 0 ? 1 : 2))
  exit "$code"
}

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is not installed: apt-get install $1 (or run scripts/setup-host.sh)"
}

# The debootstrap rootfs of the day as a tarball; older ones are removed.
base_tarball() {
  local tar="$CACHE/debian-bookworm-minbase-$(date -u +%Y%m%d).tar"
  if [ ! -s "$tar" ]; then
    [ "$(id -u)" -eq 0 ] || die "--debootstrap needs root (debootstrap creates device nodes and owners)"
    need debootstrap
    mkdir -p "$CACHE"
    local dir="$CACHE/rootfs.$$"
    rm -rf "$dir"
    say "debootstrap --variant=minbase bookworm from $MIRROR (about 2 min; cached for today in $tar)"
    debootstrap --variant=minbase bookworm "$dir" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
      || { rm -rf "$dir"; die "debootstrap failed; see $CACHE/debootstrap.log (set DEBIAN_MIRROR to another mirror)"; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" --numeric-owner -cf "$tar.tmp" .
    mv "$tar.tmp" "$tar"
    rm -rf "$dir"
    find "$CACHE" -maxdepth 1 -name 'debian-bookworm-minbase-*.tar' ! -path "$tar" -delete
  fi
  echo "$tar"
}

# Import the tarball as localhost/debian:12-slim unless that image already came from it (a label says
# which), so the build's layer cache survives reruns.
import_base() {
  local tar name current
  tar=$(base_tarball)
  name=$(basename "$tar")
  current=$(podman image inspect --format '{{index .Config.Labels "org.rankecho.base"}}' "$BASE_IMAGE" \
    2>/dev/null || true)
  if [ "$current" != "$name" ]; then
    say "importing $name as $BASE_IMAGE"
    podman import --change "LABEL org.rankecho.base=$name" --change 'CMD ["/bin/bash"]' \
      "$tar" "$BASE_IMAGE" >/dev/null
  fi
}

build() {
  local tag="" engine="" debootstrap=0 chroot=0 push=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --tag) tag=${2:?--tag needs a value}; shift 2 ;;
      --engine) engine=${2:?--engine needs podman or docker}; shift 2 ;;
      --debootstrap) debootstrap=1; shift ;;
      --chroot) chroot=1; shift ;;
      --push) push=${2:?--push needs registry/repository:tag}; shift 2 ;;
      -h|--help) usage 0 ;;
      *) say "unknown option $1"; usage ;;
    esac
  done
  if [ -z "$engine" ]; then
    if command -v podman >/dev/null 2>&1; then engine=podman; else engine=docker; fi
  fi
  case "$engine" in podman|docker) need "$engine" ;; *) die "--engine must be podman or docker, not $engine" ;; esac
  if [ "$engine" = docker ] && [ $((debootstrap + chroot)) -gt 0 ]; then
    die "--debootstrap and --chroot need --engine podman"
  fi
  local version
  version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$ROOT/rankecho/__init__.py")
  tag=${tag:-rankecho:$version}

  local args=(build -t "$tag" -f "$ROOT/Dockerfile")
  if [ "$debootstrap" -eq 1 ]; then
    import_base
    args+=(--build-arg "BASE=$BASE_IMAGE")
  fi
  [ "$chroot" -eq 0 ] || args+=(--isolation=chroot --network=host)
  local var
  for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DEFAULT_TIMEOUT; do
    [ -z "${!var:-}" ] || args+=(--build-arg "$var=${!var}")
  done
  if [ "$engine" = podman ]; then
    local user_conf="${XDG_CONFIG_HOME:-$HOME/.config}/pip/pip.conf" ca
    [ ! -f /etc/pip.conf ] || args+=(-v /etc/pip.conf:/etc/pip.conf:ro)
    [ ! -f "$user_conf" ] || args+=(-v "$user_conf:/root/.config/pip/pip.conf:ro")
    ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
    if [ -f "$ca" ]; then
      args+=(-v "$ca:/run/rankecho-build/ca.crt:ro" --build-arg PIP_CERT=/run/rankecho-build/ca.crt)
    fi
  fi
  say "$engine ${args[*]} $ROOT"
  local start=$SECONDS
  "$engine" "${args[@]}" "$ROOT" >&2
  say "built $tag in $((SECONDS - start)) s"

  if [ -n "$push" ]; then
    "$engine" tag "$tag" "$push"
    if [ "$engine" = podman ]; then
      local digestfile
      digestfile=$(mktemp)
      podman push --digestfile "$digestfile" "$push" >&2
      say "pushed $push; pin it: --set image.repository=${push%:*} --set image.digest=$(cat "$digestfile")"
      rm -f "$digestfile"
    else
      docker push "$push" >&2
      say "pushed $push; pin it with image.digest: $(docker inspect --format '{{join .RepoDigests " "}}' "$push")"
    fi
  fi
  echo "$tag"
}

run_chroot() {
  local image=${1:-}
  [ -n "$image" ] && [ "$image" != -- ] || die "run-chroot needs an IMAGE, then -- COMMAND"
  shift
  local user="" binds=() extra_env=() host dest
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case "$1" in
      --user) user=${2:?--user needs UID:GID}; shift 2 ;;
      --env|-e)  # NAME=VALUE, or NAME: its value in this environment, as in podman run
        [ -n "${2:-}" ] || die "--env needs NAME=VALUE or NAME"
        if [[ "$2" == *=* ]]; then extra_env+=("$2"); elif [ -n "${!2+set}" ]; then extra_env+=("$2=${!2}"); fi
        shift 2 ;;
      --volume|-v)
        host=${2%%:*} dest=${2#*:}
        [ -d "$host" ] || die "--volume $2: $host is not a directory"
        [[ "$dest" == /* ]] || die "--volume $2: the destination must be absolute"
        binds+=("$host" "$dest"); shift 2 ;;
      *) die "run-chroot: unknown option $1 (options go before --)" ;;
    esac
  done
  [ "${1:-}" = -- ] && [ $# -ge 2 ] || die "run-chroot: give the command after --"
  shift
  [ "$(id -u)" -eq 0 ] || die "run-chroot needs root (mount namespaces and chroot)"
  need podman
  need unshare
  local root env=()
  root=$(podman image mount "$image") || die "cannot mount $image: build it first (scripts/build-image.sh)"
  mapfile -t env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$image" \
    | sed '/^$/d')
  [ -n "$user" ] || user=$(podman image inspect --format '{{.Config.User}}' "$image")
  user=${user:-0:0}
  [[ "$user" == *:* ]] || user="$user:$user"
  local i
  for ((i = 1; i < ${#binds[@]}; i += 2)); do
    [ -d "$root${binds[i]}" ] || die "--volume: ${binds[i]} does not exist in $image (the image is read-only)"
  done
  # unshare without --fork execs in place: sh, then chroot, then the command keep this PID.
  exec unshare --mount --propagation private -- /bin/sh -euc '
    root=$1 user=$2; shift 2
    mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
    for d in proc sys dev; do mount --rbind "/$d" "$root/$d"; done
    while [ "$1" != -- ]; do mount --bind "$1" "$root$2"; shift 2; done
    shift
    exec chroot --userspec="$user" "$root" "$@"
  ' sh "$root" "$user" "${binds[@]}" -- /usr/bin/env -i "${env[@]}" "${extra_env[@]}" "$@"
}

case "${1:-}" in
  run-chroot) shift; run_chroot "$@" ;;
  build) shift; build "$@" ;;
  -h|--help) usage 0 ;;
  *) build "$@" ;;
esac
