# Two commands from a clean clone: `make run` serves the default model, `make test` tests.
VENV ?= .venv
PY := $(VENV)/bin/python
LOCK ?= deploy/constraints.txt
export VENV LOCK
# Some machines (this team's images among them) set PYTHONDONTWRITEBYTECODE=1: then the
# gateway's own modules are compiled afresh in every process the suite starts, and pytest
# rewrites the assertions of every test module and plugin on every run (issue 55: half of
# collection's time, measured). Caches in __pycache__ (git-ignored) instead.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install browser agents run prepare-model test test-all test-agents test-fast test-newest lock lint image clean

# Every package at the release the suite last passed on: deploy/constraints.txt (the lock).
install:
	@bash deploy/install.sh

browser:
	@bash deploy/install-browser.sh

# Claude Code and Codex CLI, pinned, into $(VENV)/agents: what the agent tests run (test-all).
agents:
	@bash deploy/install-agents.sh

prepare-model: install
	$(VENV)/bin/llm-gateway prepare-model

run: install
	$(VENV)/bin/llm-gateway serve

# What a contributor runs before every commit: every behaviour the session's shared engine and
# servers can check (about 10 minutes on 2 cores, README). It ends with the slowest 25 tests.
test: install browser
	$(PY) -m pytest -q -m "not own_engine and not long and not conversion" --durations=25 $(PYTEST_ARGS)

# `make test` plus what starts engines, servers or clusters of its own (vLLM's server, Ray
# replicas, the SageMaker container, engine recovery, the LoRA engine), the benches' quick
# runs, the long runs on the session's engine and the default model's conversion afresh:
# what CI runs (.ci/run), the real coding agents among them (`make agents` installs them). About
# 30 minutes on 2 cores (README).
test-all: install browser agents
	$(PY) -m pytest -q --durations=25 $(PYTEST_ARGS)

# Claude Code and Codex CLI (installed pinned from npm) against the gateway alone: their
# recorded requests replayed and each completing a turn, on the default model with its RoPE
# scaled and its sampling set (tests/test_agents.py says why). `make test-all` runs them too.
test-agents: install agents
	$(PY) -m pytest -q tests/test_agents.py $(PYTEST_ARGS)

# The pure tests only (protocols, config, admission, store...): no engine is started, none
# needs vLLM (tests/conftest.py marks every test that uses the engine), and the default model
# is not converted afresh (the `conversion` tests: `make test-all` runs them).
test-fast: install
	$(PY) -m pytest -q -m "not engine and not own_engine and not conversion" $(PYTEST_ARGS)

# The newest releases of everything, in a scratch venv, through `make test`: drift met on
# purpose. When it passes (fixed in its own commit where it did not), `make lock` writes the
# lock from that venv, and a clean clone installs exactly it.
NEWEST_VENV ?= .venv-newest
test-newest:
	VENV=$(NEWEST_VENV) LOCK=none bash deploy/install.sh
	$(MAKE) test VENV=$(NEWEST_VENV) LOCK=none

lock:
	@test -x $(NEWEST_VENV)/bin/python || { echo "make test-newest first: the lock is its venv"; exit 2; }
	@{ sed -n '/^#/p' deploy/constraints.txt; \
	  $(NEWEST_VENV)/bin/python -m pip freeze --exclude-editable 2>/dev/null; } > deploy/constraints.txt.new
	@mv deploy/constraints.txt.new deploy/constraints.txt
	@echo "deploy/constraints.txt written from $(NEWEST_VENV): commit it with the tests it passed"

lint: install
	$(VENV)/bin/ruff check gateway protocols gateway_bench tests
	$(VENV)/bin/ruff format --check gateway protocols gateway_bench tests
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy tests
	@# the layers of docs/ARCHITECTURE.md and no import circles: contracts in pyproject.toml
	$(VENV)/bin/lint-imports
	@# vLLM's and Ray's private names only in their seams (docs/ARCHITECTURE.md, "The seam to vLLM")
	$(PY) tests/private_names.py gateway protocols gateway_bench tests
	$(VENV)/bin/hadolint $(filter-out %.dockerignore,$(wildcard deploy/*/Dockerfile*))
	@# kubernetes-validate has no schema for the ServiceMonitor (a CRD): tests/test_deploy_manifests.py
	@# checks it against the Prometheus Operator's, in deploy/k8s/schemas/.
	@for overlay in deploy/k8s/overlays/*/; do \
	  echo "kubernetes-validate $$overlay"; \
	  $(VENV)/bin/kubectl kustomize $$overlay > $(VENV)/k8s-rendered.yaml || exit 1; \
	  $(VENV)/bin/kubernetes-validate --strict --quiet $(VENV)/k8s-rendered.yaml || exit 1; \
	done

# The container image (deploy/docker/Dockerfile) where Docker or Podman works; IMAGE_TARGET=cuda
# for NVIDIA GPUs. docs/DEPLOY.md says how to run it.
IMAGE ?= llm-gateway
IMAGE_TARGET ?= cpu
CONTAINER ?= $(shell command -v docker || command -v podman)
image:
	$(CONTAINER) build -f deploy/docker/Dockerfile --target $(IMAGE_TARGET) -t $(IMAGE):$(IMAGE_TARGET) \
	  $(if $(findstring podman,$(CONTAINER)),--ignorefile deploy/docker/Dockerfile.dockerignore) .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
