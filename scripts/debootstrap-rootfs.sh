#!/usr/bin/env bash
# Build (once) a minimal Debian 12 rootfs with debootstrap, for the tests that need a real
# distribution and no registry: the container image's base (imported into dockerd) and the
# systemd-nspawn boot test. Idempotent and safe to call from several tests at once (flock).
#
#   scripts/debootstrap-rootfs.sh [DEST]     default DEST: $MOPTD_ROOTFS or
#                                            /var/cache/moptd-ci/bookworm-rootfs
#
# The rootfs carries systemd (the nspawn test boots it) and python3 (moptd runs in it);
# callers copy it before changing anything, so the cached tree stays pristine.
set -euo pipefail
dest="${1:-${MOPTD_ROOTFS:-/var/cache/moptd-ci/bookworm-rootfs}}"
mirror="${MOPTD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# systemd and dbus: a bootable init for nspawn; python3 + venv: moptd itself;
# ca-certificates: nothing is fetched inside, but pip's own checks want the bundle present.
packages="systemd,systemd-sysv,dbus,python3,python3-venv,ca-certificates"

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
debootstrap --variant=minbase --include="$packages" bookworm "$dest.partial" "$mirror" \
    >"$dest.log" 2>&1 || {
    echo "debootstrap-rootfs: debootstrap failed; last lines of $dest.log:" >&2
    tail -n 20 "$dest.log" >&2
    exit 1
}
# apt caches are not needed inside and double the image size.
rm -rf "$dest.partial/var/cache/apt/archives/"*.deb "$dest.partial/var/lib/apt/lists/"*
touch "$dest.partial/.moptd-rootfs-complete"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "debootstrap-rootfs: $dest ready" >&2
