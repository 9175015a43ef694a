#!/bin/sh
# `make lock`: the locks, with every distribution's sha256 (pip install --require-hashes), from pyproject.toml.
#   requirements.lock                   what the gateway runs on (the image installs it, with its engine's lock)
#   requirements-terraform.lock         the image's terraform engine: the Terraform sample's test provider
#   requirements-cloudformation.lock    the image's cloudformation engine: the `cloudformation` extra
#   requirements-dev.lock               all of it, plus the test tools: what `make test` installs
# Each keeps its current pins unless pyproject.toml asks for others; `tools/lock.sh --upgrade` moves them all.
set -eu
cd "$(dirname "$0")/.."
uv="${UV:-uv}"
options="--python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header --annotation-style line $*"
"$uv" pip compile pyproject.toml $options -o requirements.lock
"$uv" pip compile pyproject.toml --extra dev -c requirements.lock $options -o requirements-dev.lock
# an engine's lock holds what it adds, at the dev lock's pins (what the suite tests)
echo "tf==1.2.0  # tools/terraform/sim_provider.py" | "$uv" pip compile - -c requirements-dev.lock $options \
  -o requirements-terraform.lock
"$uv" pip compile pyproject.toml --extra cloudformation -c requirements-dev.lock $options \
  -o requirements-cloudformation.lock
