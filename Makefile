# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# A CPU wheel of torch when none is present: a plain `torch` requirement
	# would otherwise pull a multi-GB CUDA build onto a machine without GPUs.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/hetsim demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy sim schedulers
	$(BIN)/lint-imports --no-cache

bench: $(STAMP)
	$(BIN)/hetsim bench

clean:
	rm -rf $(VENV) results/*
