PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install bytecode demo test bench lint docs clean

install: $(STAMP)

# The stamp makes `make install` a no-op while requirements.txt is unchanged.
# uv installs the same pinned set in about a third of pip's time (measured: the history
# of docs/benchmarks.md);
# it reads no pip.conf, so where it cannot reach an index pip does the install.
$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q uv
	$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode -r requirements.txt \
		|| $(BIN)/pip install -q -r requirements.txt
	$(BIN)/python -c "from duckdb_extensions import import_extension; import_extension('sqlite')"
	touch $(STAMP)

# The project's bytecode, written ahead: where PYTHONDONTWRITEBYTECODE is set (CI
# machines, some clusters) every crawl process would compile the project's modules
# again at start, ~15% of a crawl process's start-up (the history of docs/benchmarks.md). Quick when
# nothing changed.
PROJECT_PACKAGES := addons benchmarks commands crawler demo extensions middlewares pipelines slurm spiders

bytecode: install
	$(BIN)/python -m compileall -q $(PROJECT_PACKAGES)

demo: bytecode
	$(BIN)/python -m demo.run

# Workers: the suite mostly waits (servers, crawl processes, Chromium, Slurm), so more
# workers than cores pay; TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 6

test: bytecode
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

bench: bytecode
	$(BIN)/python -m benchmarks.run

# The documentation site (docs/, mkdocs.yml) into site/; warnings are errors, as in CI.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) demo-data bench-data site
