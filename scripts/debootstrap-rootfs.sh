#!/usr/bin/env bash
# Build (once) a minimal Debian 12 rootfs with debootstrap, for the tests that need a real
# distribution and no registry. Idempotent and safe to call from several tests at once (flock).
#
#   scripts/debootstrap-rootfs.sh [--bare] [DEST]
#
#   (default)  the systemd machine that tests/test_nspawn_systemd.py boots: minbase plus
#              systemd, dbus and python3. DEST: $MOPTD_ROOTFS or
#              /var/cache/moptd-ci/bookworm-rootfs
#   --bare     the container image's base stand-in: `debootstrap --variant=minbase bookworm`
#              and nothing else, as bare as the debian:bookworm-*-slim the Dockerfile names
#              (no python3: the image must bring its own, tests/test_image_docker.py).
#              DEST: $MOPTD_BASE_ROOTFS or /var/cache/moptd-ci/bookworm-minbase
#
# Callers copy the tree before changing anything, so the cached one stays pristine.
set -euo pipefail
bare=""
if [[ "${1:-}" == "--bare" ]]; then
    bare=1
    shift
fi
if [[ -n "$bare" ]]; then
    dest="${1:-${MOPTD_BASE_ROOTFS:-/var/cache/moptd-ci/bookworm-minbase}}"
    include=()
else
    dest="${1:-${MOPTD_ROOTFS:-/var/cache/moptd-ci/bookworm-rootfs}}"
    # systemd and dbus: a bootable init for nspawn; python3 + venv: moptd itself;
    # ca-certificates: nothing is fetched inside, but pip's own checks want the bundle present.
    include=(--include="systemd,systemd-sysv,dbus,python3,python3-venv,ca-certificates")
fi
mirror="${MOPTD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if [[ $EUID -ne 0 ]]; then
    echo "debootstrap-rootfs: needs root (debootstrap chroots)" >&2
    exit 2
fi
if ! command -v debootstrap >/dev/null; then
    echo "debootstrap-rootfs: debootstrap is not installed (apt-get install debootstrap)" >&2
    exit 2
fi
mkdir -p "$(dirname "$dest")"
exec 9>"$dest.lock"
flock 9
if [[ -f "$dest/.moptd-rootfs-complete" ]]; then
    exit 0
fi
rm -rf "$dest.partial"
echo "debootstrap-rootfs: building $dest from $mirror (a few minutes, once)" >&2
debootstrap --variant=minbase "${include[@]}" bookworm "$dest.partial" "$mirror" \
    >"$dest.log" 2>&1 || {
    echo "debootstrap-rootfs: debootstrap failed; last lines of $dest.log:" >&2
    tail -n 20 "$dest.log" >&2
    exit 1
}
# apt caches are not needed inside and double the image size (the slim image has no
# package lists either: apt-get update first, as there).
rm -rf "$dest.partial/var/cache/apt/archives/"*.deb "$dest.partial/var/lib/apt/lists/"*
touch "$dest.partial/.moptd-rootfs-complete"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "debootstrap-rootfs: $dest ready" >&2
