# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# A CPU wheel of torch, from PyTorch's CPU index, when none is present: a plain
	# `torch` requirement would otherwise pull a multi-GB CUDA build onto a machine
	# without GPUs. A torch already installed (a CUDA build included) is kept.
	$(BIN)/python -c "import torch" 2>/dev/null || \
		$(BIN)/python -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
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

# Removes the venv and the untracked files under results/ (what the commands wrote);
# the committed reports stay. Outside a git checkout results/ is left alone, as
# nothing tells there which files are the committed ones.
clean:
	rm -rf $(VENV)
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		git ls-files --others -z -- results | xargs -0 -r rm -f --; \
		find results -mindepth 1 -type d -empty -delete 2>/dev/null || true; \
	else \
		echo "make clean: not a git checkout; results/ left alone"; \
	fi
