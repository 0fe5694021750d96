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

.PHONY: help demo test test-fast reliability lint format hooks ui bench clean system-packages

help:  ## this list
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## /  make \1\t/' | expand -t 24

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)  ## the default job, the residual audit, on the built-in world (trains the tiny policy on first use)
	$(PY) main.py

# Debian's PostgreSQL, Chromium and ChromeDriver for the server and UI tests, and OSMesa (libosmesa6) for
# MuJoCo's camera rendering on the CPU (apt-get, when root and missing).
system-packages:  ## Debian's PostgreSQL, Chromium and OSMesa for the server, UI and camera tests, when missing
	@scripts/system_packages.sh

test: $(STAMP) system-packages  ## every test, nothing skipped (what CI runs); checks docs/reliability.md
	$(PY) -m pytest $(PYTEST_PARALLEL) --durations=25 $(PYTEST_ARGS)

test-fast: $(STAMP)  ## the tests not marked slow
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow" $(PYTEST_ARGS)

reliability: $(STAMP) system-packages  ## every test, then write docs/reliability.md from what they observed
	VLAEVAL_WRITE_RELIABILITY=1 $(PY) -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

lint: $(STAMP)  ## ruff format --check, ruff check, mypy, the code-health ceilings (what CI and pre-commit run)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) scripts/code_health.py --check

format: $(STAMP)  ## ruff format and the safe ruff fixes, in place
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

hooks: $(STAMP)  ## install the pre-commit hooks (.pre-commit-config.yaml: the same commands as make lint)
	$(PY) -m pip install --quiet 'pre-commit>=3.5'
	$(VENV)/bin/pre-commit install

ui: $(STAMP)  ## MLflow UI on ./mlflow.db at http://127.0.0.1:5000
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000 --workers 1

bench: $(STAMP)  ## the benchmarks (figures in benchmarks/results/ and docs/)
	# Opacus 1.6, the per-sample gradients' reference: without its dependencies, so torch stays 2.13.0.
	$(PY) -m pip install --quiet --no-deps "opacus==1.6.0" "opt_einsum>=3.3"
	$(PY) benchmarks/residual_audit.py
	$(PY) benchmarks/gauntlet_throughput.py
	$(PY) benchmarks/per_sample_gradients.py
	$(PY) benchmarks/builtin_policy.py
	$(PY) benchmarks/seqtest_efficiency.py
	# The peers (STEP, SAVI, Lai, Barnard): non-commercial licence, measured only, never imported by vlaeval.
	$(PY) -m pip install --quiet "sequentialized-barnard-tests==0.0.9"
	$(PY) benchmarks/peer_comparison.py
	$(PY) benchmarks/certified_decisions.py
	$(PY) benchmarks/certificate_attacks.py
	$(PY) benchmarks/score_shards.py
	$(PY) benchmarks/vision_speed.py
	$(PY) benchmarks/vision_ablations.py
	$(PY) benchmarks/ablation.py
	$(PY) benchmarks/rollout_throughput.py
	$(PY) benchmarks/camera_video.py
	$(PY) benchmarks/vision_policy.py

clean:  ## caches and run outputs
	rm -rf .cache outputs/2* multirun_sweeps/2*
