# rankecho: the two commands a newcomer needs are `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint demo bench mutation sim-libs clean

install: $(STAMP)

$(STAMP): pyproject.toml scripts/setup-host.sh scripts/link-bcc.sh scripts/setup-interop.sh tests/interop/package-lock.json
	bash scripts/setup-host.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	bash scripts/link-bcc.sh $(VENV)
	bash scripts/setup-interop.sh
	touch $(STAMP)

# The fake libcudart/libnccl used to test the agent without GPUs.
sim-libs:
	@if [ -f sim/Makefile ]; then $(MAKE) -s -C sim; fi

test: install sim-libs
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

demo: install sim-libs
	$(BIN)/python -m rankecho.demo

# Prints every benchmark's report; writes the results with their date, load and command to build/bench.json
# and rewrites the latest-run section of docs/benchmarks.md from them (the one place for measured numbers).
bench: install sim-libs
	$(BIN)/python -m bench --json build/bench.json --markdown docs/benchmarks.md

# Mutation testing (mutmut) of the guard, the writer, event and chain ids and the health score; not part
# of `make test`. Each target stops after MUTATION_BUDGET_S seconds. Scores: docs/testing.md.
# `make mutation MUTATION_TARGETS="health chain event_id"` runs only the fast, pure ones.
MUTATION_TARGETS ?=
MUTATION_BUDGET_S ?= 900
mutation: install
	$(BIN)/python scripts/mutation.py $(MUTATION_TARGETS) --budget-s $(MUTATION_BUDGET_S) --report build/mutation.json

clean:
	rm -rf $(VENV) build *.egg-info
	@if [ -f sim/Makefile ]; then $(MAKE) -s -C sim clean; fi
