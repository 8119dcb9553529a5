#!/usr/bin/env bash
# Build a local base image for machines that cannot pull from any registry: a debootstrap'd
# Debian bookworm root (python3 + venv, redis-server, prometheus, wget) imported with `docker import`.
# Usage: deploy/docker/build_base_image.sh [rootfs|import|all] (env: ROOTFS, MIRROR, TAG, DOCKER)
set -euo pipefail
ROOTFS=${ROOTFS:-/tmp/rackserve-rootfs}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
TAG=${TAG:-rackserve-base:bookworm}
DOCKER=${DOCKER:-docker}
PACKAGES=python3,python3-venv,redis-server,prometheus,ca-certificates,wget

make_rootfs() {
  if [ -x "$ROOTFS/usr/bin/python3" ] && [ -x "$ROOTFS/usr/bin/prometheus" ]; then
    echo "rootfs $ROOTFS already built; reusing it" >&2
    return
  fi
  nice -n 19 debootstrap --variant=minbase --include="$PACKAGES" bookworm "$ROOTFS" "$MIRROR"
  # Keep the image small: no apt lists, caches, docs or man pages.
  rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
    "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
    "$ROOTFS"/usr/share/locale/*
}

import_rootfs() {
  tar --numeric-owner -C "$ROOTFS" -c . | nice -n 19 "$DOCKER" import \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$TAG"
}

case "${1:-all}" in
  rootfs) make_rootfs ;;
  import) import_rootfs ;;
  all) make_rootfs; import_rootfs ;;
  *) echo "usage: $0 [rootfs|import|all]" >&2; exit 2 ;;
esac
