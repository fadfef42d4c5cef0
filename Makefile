# Two commands do all set-up on a fresh machine:
#   make demo   - create/refresh .venv, then evaluate the bundled tiny CLIP on the bundled shapes datasets
#   make test   - create/refresh .venv, then run the test suite (what CI runs)
#   make test-fast - the fast tier for inner-loop work (pure functions, registries, configs, the CLI in-process)
PY ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
export PREFECT_HOME ?= $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM := false

.PHONY: venv demo test test-fast test-faults test-hostile lint clean

venv: $(STAMP)

# The example plugin package (docs/plugins.md) is installed too: the test suite uses its loader and dataset reader.
$(STAMP): pyproject.toml examples/clipcache-plugin-example/pyproject.toml
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	$(VENV)/bin/python -m pip install -q -e examples/clipcache-plugin-example
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/clipcache eval --model tiny-shapes-clip --dataset shapes shapes_retrieval --output_dir outputs --cache_dir cache

# One pytest worker per core this process may run on (nproc: the CPU affinity, as a container's cpuset sets it), each
# running torch on one thread (tests/conftest.py); a test file stays on one worker (--dist loadfile), so its module
# fixtures are built once; files are handed out in tests/conftest.py's order, heaviest first (--no-loadscope-reorder).
# PYTEST_PARALLEL= runs in one process.
PYTEST_PARALLEL ?= -n $(shell nproc 2>/dev/null || echo 2) --dist loadfile --no-loadscope-reorder

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -m "not full" -q $(PYTEST_PARALLEL)

test-faults: $(STAMP)
	$(VENV)/bin/python -m pytest -q tests/test_faults.py tests/test_faults_prefect.py tests/test_bad_input_corpus.py

test-hostile: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m hostile

# mypy runs from its own venv, .venv/lint (mypy 2 needs pathspec >= 1, which the pinned dbt-core refuses), at the version
# of pyproject.toml's `lint` group, with pydantic at .venv's version for its mypy plugin; it checks against .venv's
# packages (--python-executable). It checks with one worker process per core (-n, sharing its incremental cache, so the
# cache folder cannot be /dev/null). A worker that does not answer within mypy's 3 s start-up limit (seen on a 2-core
# machine at load 9) ends mypy with status 2, an internal error: that status alone reruns the same checks in one process;
# type errors (status 1) fail at once. MYPY_WORKERS=0 checks in one process.
LINT_VENV ?= $(VENV)/lint
MYPY_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
MYPY := $(LINT_VENV)/bin/mypy --python-executable $(VENV)/bin/python

$(LINT_VENV)/.installed: pyproject.toml $(STAMP)
	@test -x $(LINT_VENV)/bin/python || $(PY) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip install -q --upgrade pip
	$(LINT_VENV)/bin/python -m pip install -q --group lint \
		"pydantic==$$($(VENV)/bin/python -c 'import pydantic; print(pydantic.VERSION)')"
	@touch $@

lint: $(STAMP) $(LINT_VENV)/.installed
	$(VENV)/bin/ruff check .
	$(MYPY) -n $(MYPY_WORKERS) -p clipcache || { test $$? -eq 2 && $(MYPY) -p clipcache; }

# `make test` is `make lint` and pytest, overlapped: ruff first (a second), then pytest in the foreground while mypy checks
# in the background in one process at the lowest CPU priority (nice 19). The pytest workers leave CPU idle while their
# tests wait on servers and subprocesses, and mypy runs in those gaps instead of in minutes of its own before pytest.
# mypy's report is printed after pytest's; the target fails if either fails. Ctrl-C stops both (one process group).
test: $(STAMP) $(LINT_VENV)/.installed
	$(VENV)/bin/ruff check .
	@log=$$(mktemp); \
	nice -n 19 $(MYPY) -p clipcache >"$$log" 2>&1 & typing=$$!; \
	$(VENV)/bin/python -m pytest $(PYTEST_PARALLEL); tests=$$?; \
	wait $$typing; typed=$$?; \
	echo "$(MYPY) -p clipcache (beside pytest, exit status $$typed):"; cat "$$log"; rm -f "$$log"; \
	test $$tests -eq 0 && test $$typed -eq 0

clean:
	rm -rf outputs cache .prefect
