# Two commands from a clean clone: `make run` serves the default model, `make test` tests.
VENV ?= .venv
PY := $(VENV)/bin/python
export VENV

.PHONY: install browser run prepare-model test lint clean

install:
	@bash deploy/install.sh

browser:
	@bash deploy/install-browser.sh

prepare-model: install
	$(VENV)/bin/llm-gateway prepare-model

run: install
	$(VENV)/bin/llm-gateway serve

test: install browser
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check gateway protocols tests
	$(VENV)/bin/ruff format --check gateway protocols tests
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy tests

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
