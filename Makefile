# make demo / make test work on a fresh machine with Python 3.11 and make:
# both create .venv and install what they need first.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# The editable install is a link tree (editable_mode=strict, so mypy sees
# fencekeeper.kernel exactly as installed); a new or removed module or data
# file (adapters/workflows/*.toml, a fixture chain's .jsonl) needs a reinstall, so the stamp depends on
# the list of package files.
PACKAGE_FILES := $(shell find api kernel adapters specs -name '*.py' -o -name py.typed -o -name "*.toml" -o -name "*.md" -o -name "*.json" -o -name "*.jsonl" | sort)
STAMP := $(VENV)/.installed

.PHONY: demo test modelcheck contracts contracts-executions contracts-journal chaos bench bench-pg bench-ops bench-journal bench-e2e bench-pickup specs apidocs clean

demo: $(STAMP)
	$(BIN)/fencekeeper demo

# The suite is spread over the machine's cores, a test file to a process (its
# module fixtures are built once); the model checker and the two CrossHair runs
# are independent single-threaded programs, so they run side by side, each
# one's output kept together.
TEST_PROCESSES ?= auto

test: $(STAMP)
	$(BIN)/ruff check api kernel adapters tests bench
	$(BIN)/mypy api kernel adapters
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist loadfile
	$(MAKE) --no-print-directory -j 3 --output-sync=target modelcheck contracts-executions contracts-journal

modelcheck: $(STAMP)
	$(BIN)/fencekeeper modelcheck

contracts: contracts-executions contracts-journal

contracts-executions: $(STAMP)
	$(BIN)/python -m tests.contracts.run_crosshair

contracts-journal: $(STAMP)
	$(BIN)/python -m tests.contracts.run_journal_crosshair

# Not part of `make test`: about two minutes of workers killed, stopped past their leases and
# cut off, on SQLite and on PostgreSQL (FENCEKEEPER_PG_DSN, default postgresql://postgres@127.0.0.1:5432/test),
# then the documented recovery and a full audit; then the same faults for about a minute more
# against `fencekeeper op worker` and durable operations; then about twenty seconds a store of
# appender processes writing shared execution journals. Every run always runs; exits 1 on any
# violation of any (docs/chaos.md).
CHAOS_SECONDS ?= 50
OPS_CHAOS_SECONDS ?= 30
JOURNAL_CHAOS_SECONDS ?= 20
CHAOS_SEED ?= 1
chaos: $(STAMP)
	status=0; \
	$(BIN)/python -m tests.chaos.run --store both --seconds $(CHAOS_SECONDS) --seed $(CHAOS_SEED) || status=1; \
	$(BIN)/python -m tests.chaos.operations --store both --seconds $(OPS_CHAOS_SECONDS) --seed $(CHAOS_SEED) || status=1; \
	$(BIN)/python -m tests.chaos.journal --store both --seconds $(JOURNAL_CHAOS_SECONDS) --seed $(CHAOS_SEED) || status=1; \
	exit $$status

bench: $(STAMP)
	$(BIN)/python -m bench.kernel_steps
	$(BIN)/python -m bench.sqlite_store
	$(BIN)/python -m bench.sqlite_hot_path
	$(BIN)/python -m bench.client_overhead

# Needs a PostgreSQL server (FENCEKEEPER_PG_DSN, default postgresql://postgres@127.0.0.1:5432/test).
bench-pg: $(STAMP)
	$(BIN)/python -m bench.postgres_store

# Durable operations and the execution journal, on SQLite and PostgreSQL (PostgreSQL as above),
# each beside a bare commit loop (and, for replay, hashing alone) measured in the same run.
bench-ops: $(STAMP)
	$(BIN)/python -m bench.operations

bench-journal: $(STAMP)
	$(BIN)/python -m bench.journal

# The worker as a user runs it, beside Procrastinate and DBOS on the same PostgreSQL server
# (FENCEKEEPER_PG_DSN, as above) and on SQLite, in one run (bench/README.md). They come from
# the optional `bench` extra, installed here and never by `make test`. About ten minutes;
# BENCH_E2E_ARGS=--quick for about two.
BENCH_E2E_ARGS ?=
bench-e2e: $(VENV)/.bench-installed
	$(BIN)/python -m bench.e2e $(BENCH_E2E_ARGS)

# How soon an idle worker starts what is submitted to it (fencekeeper op worker, fencekeeper worker,
# procrastinate worker), by the database's own clocks; about three minutes (bench/README.md).
bench-pickup: $(VENV)/.bench-installed
	$(BIN)/python -m bench.pickup

$(VENV)/.bench-installed: $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[bench]' --config-settings editable_mode=strict
	touch $@

# Regenerate specs/machines/*.toml and docs/machines.md from the kernel (export-specs leaves
# the other, hand-written specs as they are: in the repository they are the shipped files), and
# docs/concepts.md's sequence diagrams from fresh runs of their scenarios, and the conformance
# cases of specs/conformance/ from the kernel (specs/conformance.md).
specs: $(STAMP)
	$(BIN)/fencekeeper export-specs specs
	$(BIN)/fencekeeper conformance --generate specs/conformance
	$(BIN)/fencekeeper docs > docs/machines.md.tmp && mv docs/machines.md.tmp docs/machines.md
	$(BIN)/python -m fencekeeper.adapters.scenarios docs/concepts.md

# The API reference, generated from the docstrings into docs/api (not committed).
# Without each page's source, which the repository has: it halves the build.
APIDOC_MODULES := fencekeeper fencekeeper.kernel fencekeeper.adapters
APIDOC_FLAGS := --docformat restructuredtext --no-show-source
apidocs: $(STAMP)
	$(BIN)/pdoc $(APIDOC_FLAGS) --output-directory docs/api $(APIDOC_MODULES)

$(STAMP): pyproject.toml constraints.txt $(VENV)/.files
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]' --config-settings editable_mode=strict
	touch $@

$(VENV)/.files: FORCE
	@mkdir -p $(VENV)
	@echo '$(PACKAGE_FILES)' | cmp -s - $@ || echo '$(PACKAGE_FILES)' > $@

FORCE:

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache .hypothesis
