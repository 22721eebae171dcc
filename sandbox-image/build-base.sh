#!/usr/bin/env bash
# Builds the sandbox's base image with no container registry: debootstrap a minimal Debian
# bookworm from the machine's own apt mirror and `docker import` it. Prints the image name.
# The tag is a hash of this script, so an unchanged script never rebuilds.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
packages="python3,python3-pip,ripgrep,git,curl,ca-certificates,procps,passwd,bash-static"
tag=$(cat "$0" | sha256sum | cut -c1-12)
image="ocsb-base:${tag}"

log() { printf 'build-base: %s\n' "$*" >&2; }

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi

mirror=""
for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
  [ -f "$f" ] || continue
  mirror=$(grep -m1 -E '^URIs:' "$f" | awk '{print $2}' || true)
  [ -n "$mirror" ] && break
  mirror=$(grep -m1 -E '^deb ' "$f" | awk '{print $2}' || true)
  [ -n "$mirror" ] && break
done
if [ -z "$mirror" ]; then
  log "no apt mirror found in the machine's apt sources"
  exit 1
fi
command -v debootstrap >/dev/null 2>&1 || {
  log "installing debootstrap from Debian's packages"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}

rootfs=$(mktemp -d /var/tmp/ocsb-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
log "debootstrap bookworm into $rootfs (this takes about a minute)"
debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$mirror" >/dev/null
# Trim what a sandbox never needs; keep dpkg's database so the Dockerfile can tell what is there.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
       "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
log "importing as $image"
tar -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
echo "$image"
