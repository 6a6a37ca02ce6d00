#!/usr/bin/env bash
# Build moptd's container image from this checkout (Dockerfile). Everything the image
# installs is prepared here, on the host, so the build itself fetches nothing:
#   1. the moptd wheel (python -m build --wheel),
#   2. every dependency as a wheel for the image's Python (Debian 12: CPython 3.11,
#      glibc 2.36) and this machine's architecture, and pip's own wheel (pip download),
#   3. Debian's python3 and what it needs, as .debs: the slim base has no Python. The
#      base's own apt resolves them against what the base has and downloads them (a
#      container of the base with the host's network; apt checks the archive signatures),
#   4. docker build with no network, installing from those .debs and wheels alone.
#
#   scripts/build-image.sh [--import-base ROOTFS] [--tag NAME:TAG]
#
# --import-base ROOTFS: where no registry is reachable, import a Debian 12 rootfs as bare
#   as the slim image (scripts/debootstrap-rootfs.sh --bare) as the Dockerfile's base
#   image, under the name the Dockerfile pins, instead of pulling it.
# Environment: PYTHON (default python3; needs the `build` package and pip), DOCKER
#   (default docker; DOCKER_HOST picks the daemon). Step 3 needs a Debian mirror reachable
#   from this machine (the base's /etc/apt sources: deb.debian.org).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
docker="${DOCKER:-docker}"
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' moptd/__init__.py)"
tag="moptd:${version}"
base_rootfs=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --import-base) base_rootfs="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
    esac
done
base="$(sed -n 's/^ARG BASE=\(.*\)$/\1/p' Dockerfile)"
[[ -n "$version" && -n "$base" ]] || { echo "build-image: no version or base found" >&2; exit 1; }

if [[ -n "$base_rootfs" ]]; then
    [[ -f "$base_rootfs/.moptd-rootfs-complete" ]] \
        || { echo "build-image: $base_rootfs is not a complete rootfs" >&2; exit 1; }
    tar -C "$base_rootfs" --exclude=./.moptd-rootfs-complete -c . | "$docker" import - "$base" >/dev/null
fi

wheels=dist/image-wheels
rm -rf "$wheels"
mkdir -p "$wheels"
"$python" -m build --wheel --outdir "$wheels" . >"$wheels.log" 2>&1 \
    || { tail -n 30 "$wheels.log" >&2; exit 1; }
wheel="$wheels/moptd-${version}-py3-none-any.whl"
# Wheels only (no sdist is compiled in the image), for the image's interpreter rather than
# the host's: manylinux up to glibc 2.36 (Debian 12), CPython 3.11. pip itself too: the
# image runs it from its wheel once (Debian's python3 has no ensurepip without
# python3-venv), so neither pip nor setuptools ends up in the image.
arch="$(uname -m)"
platforms=()
for glibc in 36 35 34 33 32 31 30 29 28 27 26 25 24 23 22 21 20 19 18 17; do
    platforms+=(--platform "manylinux_2_${glibc}_${arch}")
done
"$python" -m pip download --disable-pip-version-check --quiet --dest "$wheels" \
    --only-binary=:all: "${platforms[@]}" --platform "manylinux2014_${arch}" \
    --implementation cp --python-version 3.11 --abi cp311 --abi abi3 --abi none \
    "$wheel" pip

# Debian's python3 for the base, as the base's apt resolves it: only what the base lacks.
debs=dist/image-debs
rm -rf "$debs"
mkdir -p "$debs"
"$docker" run --rm --network host --user 0 -v "$PWD/$debs:/debs" "$base" sh -c '
    set -e
    apt-get update -qq
    apt-get install -qq -y --download-only --no-install-recommends \
        -o Dir::Cache::archives=/debs python3 >/dev/null
    rm -rf /debs/partial /debs/lock
    chown -R "$0" /debs' "$(id -u):$(id -g)" >"$debs.log" 2>&1 \
    || { echo "build-image: downloading python3's .debs for $base failed:" >&2
         tail -n 20 "$debs.log" >&2; exit 1; }
compgen -G "$debs/python3.11-minimal_*.deb" >/dev/null \
    || { echo "build-image: no python3.11-minimal among the .debs in $debs" >&2; exit 1; }

# The legacy builder: BuildKit needs the buildx plugin, which Debian's docker.io lacks;
# --network none: nothing may be fetched while building.
DOCKER_BUILDKIT=0 "$docker" build --network none --pull=false \
    --build-arg "VERSION=$version" -t "$tag" . >&2
echo "$tag"
