# moptd's container image: moptd in a virtual environment of its own on Debian 12, running
# `moptd run`. Build it with scripts/build-image.sh, which prepares everything the image
# installs on the host first (the moptd wheel, every dependency as a wheel, and Debian's
# python3 as .debs): nothing is fetched during the build (no registry, Debian mirror or
# PyPI needs to be reachable from the build container).
#
# The base is pinned to a dated Debian 12 slim tag. It has no Python: the first stage
# installs Debian's own python3 (3.11) from the .debs the script downloaded with this
# base's apt. Where no registry is reachable (CI), the base is a `debootstrap
# --variant=minbase bookworm` rootfs, as bare as the slim image (no python3), imported
# under this exact name (scripts/debootstrap-rootfs.sh --bare, scripts/build-image.sh
# --import-base ROOTFS; tests/test_image_docker.py).
ARG BASE=debian:bookworm-20241111-slim

FROM ${BASE} AS python
# dist/image-debs: python3 and the packages it needs that the base lacks (build-image.sh)
COPY dist/image-debs/ /tmp/debs/
# apt, not dpkg -i: it orders the installs by their Pre-Depends (python3-minimal needs
# python3.11-minimal configured first). Every package is in /tmp/debs, and the build has
# no network (apt's --no-download trips over local files: "Pathname to install is not
# absolute").
RUN DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends \
        /tmp/debs/*.deb >/dev/null \
    && rm -rf /tmp/debs /var/cache/apt/*.bin \
    && python3 --version

FROM python AS build
# dist/image-wheels: the moptd wheel, its dependencies and pip (scripts/build-image.sh)
COPY dist/image-wheels/ /wheels/
# Debian's python3 has no ensurepip (that is python3-venv): the venv gets no pip, and pip
# runs once from its own wheel, so neither pip nor setuptools is in the image.
RUN python3 -m venv --without-pip /opt/moptd \
    && pip_wheel="$(ls /wheels/pip-*.whl)" \
    && /opt/moptd/bin/python "$pip_wheel/pip" install --no-index --find-links /wheels \
        --no-compile --disable-pip-version-check --no-cache-dir moptd \
    && find /opt/moptd -name '__pycache__' -prune -exec rm -rf {} +

FROM python
# an ARG before the first FROM is not seen inside a stage unless named again
ARG BASE
# scripts/build-image.sh passes moptd/__init__.py's __version__ (the default is checked
# against it in tests/test_image_docker.py)
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="moptd" \
      org.opencontainers.image.description="Node daemon and rule-based diagnostician for NVIDIA GPU inference hosts" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/moptd/moptd" \
      org.opencontainers.image.documentation="https://github.com/moptd/moptd/blob/main/docs/install.md" \
      org.opencontainers.image.base.name="${BASE}"
# The venv's python is a link to /usr/bin/python3 (Debian 12: 3.11) of the python stage,
# so the build stage and this one both start from it.
COPY --from=build /opt/moptd /opt/moptd
COPY deploy/image/moptd.yaml /etc/moptd/moptd.yaml
# A user of its own: with `docker run` moptd needs no root (NVML through the NVIDIA
# runtime, /proc and /sys are readable by anyone). Only /dev/kmsg (the Xid lines) is
# root's; the Kubernetes DaemonSet runs the container as root for it (docs/install.md).
RUN groupadd --gid 10001 moptd \
    && useradd --uid 10001 --gid moptd --home-dir /var/lib/moptd \
        --no-create-home --shell /usr/sbin/nologin moptd \
    && install -d -o moptd -g moptd -m 0750 /var/lib/moptd /run/moptd
# XDG_*: the non-root defaults of state_dir and api.socket then are root's
# (/var/lib/moptd, /run/moptd/api.sock), so `docker exec ... moptd status` finds the
# daemon as either user.
ENV PATH=/opt/moptd/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    XDG_STATE_HOME=/var/lib \
    XDG_RUNTIME_DIR=/run \
    PYTHONDONTWRITEBYTECODE=1
USER moptd
EXPOSE 9477
# Healthy while the local API answers GET /v1/health (200); stdlib only, no curl in here.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["/opt/moptd/bin/python", "-c", "import socket,sys; s=socket.socket(socket.AF_UNIX); s.settimeout(8); s.connect('/run/moptd/api.sock'); s.sendall(b'GET /v1/health HTTP/1.0\\r\\nHost: moptd\\r\\n\\r\\n'); sys.exit(0 if s.recv(64).split(b' ')[1:2] == [b'200'] else 1)"]
ENTRYPOINT ["/opt/moptd/bin/moptd"]
CMD ["run"]
