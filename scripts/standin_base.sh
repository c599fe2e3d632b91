#!/usr/bin/env bash
# A local stand-in for the official python:3.11-slim, for machines that cannot reach Docker Hub
# but can reach a Debian mirror: debootstrap of Debian 12 (bookworm, what python:3.11-slim is
# built on) plus Debian's Python 3.11, made to look like the official image where the
# Dockerfile relies on it: `python`, `python3`, `pip`, `pip3` in /usr/local/bin, pip installs
# as root without the "externally-managed-environment" error, LANG=C.UTF-8, CMD python3.
#
#   sudo scripts/standin_base.sh [TAG]        # default TAG: context-proxy-standin/python:3.11-slim
#
# Needs root, debootstrap and a running Docker daemon. The mirror is the first Debian URI that
# apt on this machine uses (override with MIRROR=...), so it works wherever apt does.
# It is NOT the official image: Debian's CPython 3.11.2 and pip 23.0.1 instead of the
# python.org build in /usr/local; packages land in /usr/local/lib/python3.11/dist-packages.
set -euo pipefail

TAG="${1:-context-proxy-standin/python:3.11-slim}"
SUITE=bookworm

apt_mirror() {  # the first .../debian URI in apt's sources (deb822 or one-line format)
    local uri
    uri=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
        | grep -oE '(https?|file)://[^ ]+/debian/?( |$)' | head -n1 | tr -d ' ' || true)
    echo "${uri:-http://deb.debian.org/debian}"
}

MIRROR="${MIRROR:-$(apt_mirror)}"
ROOT=$(mktemp -d /tmp/standin-rootfs.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT

echo "standin_base: debootstrap $SUITE from $MIRROR into $ROOT" >&2
debootstrap --variant=minbase --include=python3.11,python3.11-venv,python3-pip,ca-certificates \
    "$SUITE" "$ROOT" "$MIRROR" >&2

# The official image's layout where a Dockerfile can see it.
for name in python python3 python3.11; do ln -sf /usr/bin/python3.11 "$ROOT/usr/local/bin/$name"; done
for name in pip pip3 pip3.11; do ln -sf /usr/bin/pip3 "$ROOT/usr/local/bin/$name"; done
rm -f "$ROOT"/usr/lib/python3.11/EXTERNALLY-MANAGED   # the official image's pip installs system-wide

# Slim: no package caches, lists, docs, man pages or locales (the official slim image has none either).
chroot "$ROOT" apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/log/*.log \
    "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* "$ROOT"/usr/share/locale/*
find "$ROOT/usr/lib/python3" "$ROOT/usr/lib/python3.11" -name __pycache__ -prune -exec rm -rf {} +

tar --numeric-owner -C "$ROOT" -c . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "stand-in for python:3.11-slim: debootstrap $SUITE + Debian python3.11" \
    - "$TAG" >&2
docker run --rm "$TAG" sh -c 'python --version && pip --version' >&2
echo "$TAG"
