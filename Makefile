# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Each creates .venv on first use. torch==2.13.0 is installed before the project so pip takes
# the CPU build on this disk instead of resolving a multi-GB CUDA build from the index.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# Two workers (CI has 2 cores); each test file runs on one worker, so module fixtures build once.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadfile

.PHONY: demo test test-fast ui bench clean system-packages

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) main.py job=residual_audit

# Debian's PostgreSQL, Chromium and ChromeDriver for the server and UI tests (apt-get, when root and missing).
system-packages:
	@scripts/system_packages.sh

test: $(STAMP) system-packages
	$(PY) -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow" $(PYTEST_ARGS)

ui: $(STAMP)
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000 --workers 1

bench: $(STAMP)
	$(PY) benchmarks/residual_audit.py
	$(PY) benchmarks/gauntlet_throughput.py
	$(PY) benchmarks/per_sample_gradients.py
	$(PY) benchmarks/builtin_policy.py
	$(PY) benchmarks/seqtest_efficiency.py

clean:
	rm -rf .cache outputs/2* multirun_sweeps/2*
