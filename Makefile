# celosia: `make demo` sets up and runs the main job, `make test` sets up and runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-slow bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: setup
	$(BIN)/celosia demo

test: setup
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

bench: setup
	mkdir -p out
	for name in $$($(BIN)/celosia bench --list --names); do \
		$(BIN)/celosia bench $$name --out out/bench-$$name.json || exit 1; done

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
