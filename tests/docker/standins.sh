#!/bin/sh
# The images the project's Dockerfile and compose.yaml name, built here from Debian's packages, because no container
# registry is reachable from the test machines: a Debian 12 base made by debootstrap (slimmed as Debian's -slim
# images are: no docs, man pages or locales), imported, then python:3.11-slim and postgres:16 stand-ins on top
# (python.Dockerfile, postgres.Dockerfile); apt keeps no package files, as in Debian's official images. Tagged with
# the real names, so the Dockerfile is built unchanged.
# Idempotent: images already present are kept.   tests/docker/standins.sh [DOCKER]
set -eu
docker="${1:-docker}"
here="$(cd "$(dirname "$0")" && pwd)"
have() { "$docker" image inspect "$1" >/dev/null 2>&1; }
if ! have gateway-test/debian:bookworm; then
  root="$(mktemp -d)"
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include=ca-certificates bookworm "$root" http://deb.debian.org/debian >/dev/null
  cat > "$root/etc/dpkg/dpkg.cfg.d/slim" <<'SLIM'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
SLIM
  cat > "$root/etc/apt/apt.conf.d/docker-clean" <<'CLEAN'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CLEAN
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  rm -rf "$root/usr/share/man"/* "$root/usr/share/info"/* "$root/usr/share/locale"/* \
         "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/* "$root/var/log"/*
  tar -C "$root" -c . | "$docker" import -c 'CMD ["bash"]' - gateway-test/debian:bookworm >/dev/null
fi
have python:3.11-slim || DOCKER_BUILDKIT=1 "$docker" build -q --network host -t python:3.11-slim \
  -f "$here/python.Dockerfile" "$here"
have postgres:16 || DOCKER_BUILDKIT=1 "$docker" build -q --network host -t postgres:16 \
  -f "$here/postgres.Dockerfile" "$here"
