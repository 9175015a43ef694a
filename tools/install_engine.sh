#!/bin/sh
# The image's engine (Dockerfile: ARG ENGINE), into DEST (default /opt/engine). terraform: the same pinned,
# sha256-checked Terraform that `make terraform` installs, with its providers, CLI config and licence NOTICE.
# cloudformation: no binary (boto3 and cfn-lint come with its lock); DEST holds only a NOTICE saying so.
#   tools/install_engine.sh [ENGINE] [DEST]     ENGINE: terraform | cloudformation
set -eu
engine="${1:-terraform}"
dest="${2:-/opt/engine}"
here="$(cd "$(dirname "$0")" && pwd)"
case "$engine" in
  terraform)
    python3 "$here/install_terraform.py" "$dest"
    ;;
  cloudformation)
    mkdir -p "$dest/plugin-cache"
    echo "The cloudformation engine: no binary here; the AWS API through boto3 (Apache-2.0)." > "$dest/NOTICE"
    ;;
  *)
    echo "ENGINE=$engine is not one this image can install: terraform (pinned, sha256-checked) or cloudformation." >&2
    echo "For OpenTofu, install a checked 'tofu' yourself and set GATEWAY_TERRAFORM_BIN." >&2
    exit 2
    ;;
esac
