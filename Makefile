# Two commands from a clean clone: `make run` serves the default model, `make test` tests.
VENV ?= .venv
PY := $(VENV)/bin/python
export VENV

.PHONY: install browser run prepare-model test test-fast lint clean

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

# The pure tests only (protocols, config, admission, store, default model): no engine is
# started and none needs vLLM; tests/conftest.py marks every test that uses the engine.
test-fast: install
	$(PY) -m pytest -q -m "not engine" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check gateway protocols gateway_bench tests
	$(VENV)/bin/ruff format --check gateway protocols gateway_bench tests
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy tests

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
