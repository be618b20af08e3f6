# Single entry point. Every target installs what it needs first (idempotent).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench clean
setup:
	bash tools/setup.sh

demo: setup
	$(PY) -m tools.demo

test: setup
	$(PY) -m pytest -q -ra --durations=40 -n 2 --dist loadgroup

lint: setup
	$(VENV)/bin/ruff check edge_agent cloud_core tools tests
	$(VENV)/bin/mypy edge_agent cloud_core tools

bench: setup
	$(PY) -m tools.bench_all --results docs/benchmarks/results.md --readme README.md

clean:
	$(PY) -m tools.lab cleanup || true
