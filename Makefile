# wellfed: `make run` sets up and runs the pipeline; `make test` sets up and runs the tests.
VENV  ?= .venv
# torch goes in first, as its own step, so the build is yours to choose (docs/getting-started.md, "Install"):
# TORCH is a pip requirement, TORCH_INDEX an index to take it from instead of PyPI, e.g. the
# CPU-only builds: make TORCH_INDEX=https://download.pytorch.org/whl/cpu run
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
BIN   := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# No usage telemetry from dvc, mlflow ui or any stage (the list: src/wellfed/privacy.py);
# a variable already in your environment wins, e.g. `MLFLOW_DISABLE_TELEMETRY=false make ui`.
export DO_NOT_TRACK ?= 1
export MLFLOW_DISABLE_TELEMETRY ?= true
export RAY_USAGE_STATS_ENABLED ?= 0
export HF_HUB_DISABLE_TELEMETRY ?= 1
# MLflow's server runs no job of ours: without its job runner `make ui` and `make team-store`
# start 8 fewer processes (benchmarks/results/server_jobs.json; scripts/team_store.py JOBS)
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION ?= false

.PHONY: install run test test-fast ui team-store bench clean
install: $(VENV)/.installed .dvc/tmp/plots.html

# `dvc plots show/diff` draw offline: DVC's page template with the Vega libraries inline (from
# the vl-convert-python package), set in .dvc/config.local (scripts/plots_page.py)
.dvc/tmp/plots.html: $(VENV)/.installed scripts/plots_page.py
	$(BIN)/python scripts/plots_page.py

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

run: install            ## prepare -> tokenize -> train -> evaluate on the offline default
	dvc repro
	@echo "done: data/eval/metrics.json, data/train/speed/diagnosis.md, models:/wellfed-classifier@champion; compare runs with 'dvc exp show --only-changed' or 'make ui'"

# Each tier prints its 15 slowest tests and a line of its count and time (pyproject's addopts,
# tests/conftest.py); the lines are gathered in WELLFED_TIERS and said again at the end.
test: export WELLFED_TIERS := $(CURDIR)/.pytest_cache/wellfed-tiers.txt
test: install           ## every tier: unit, e2e pipelines, real data (CI)
	@rm -f $(WELLFED_TIERS)
	@# the fast tier as a newcomer runs it, plain `pytest` (no `python -m`: the cwd is not on sys.path)
	pytest
	@# a module to a worker (its project built once), the longest first (tests/conftest.py's
	@# groups and order); -rA: what the real-data runs print, which -s cannot show from a worker
	python -m pytest tests -m "slow or e2e or integration" --dist loadgroup --no-loadscope-reorder -rA
	@cat $(WELLFED_TIERS)

test-fast: install      ## the fast tier: unit tests only (the same as a plain `pytest`)
	python -m pytest tests

UI_WARNINGS = ignore:starlette.middleware.wsgi is deprecated
ui: install             ## MLflow UI over the project's store, on loopback only
	@# the runs table in its headline view (eval/* columns, best first, Models with @champion), in
	@# the Model training view: docs/mlflow.md, "In the UI"
	@python -m wellfed.track.runs_view sqlite:///$(CURDIR)/mlflow.db
	@echo "MLFLOW_DISABLE_TELEMETRY=$(MLFLOW_DISABLE_TELEMETRY): true keeps the UI's telemetry off, whatever Settings' 'Enable telemetry' shows (docs/privacy.md)"
	@# MLflow's server imports starlette.middleware.wsgi, deprecated by Starlette: one warning per
	@# server worker, nothing a user can act on (tests/test_ui_warnings.py)
	PYTHONWARNINGS="$(UI_WARNINGS)" mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000

# The team store's folder (its PostgreSQL, artifacts, log), address and port: docs/team.md.
TEAM_STORE_DIR  ?= .team-store
TEAM_STORE_HOST ?= 127.0.0.1
TEAM_STORE_PORT ?= 5000
team-store: install     ## MLflow server on PostgreSQL, artifacts proxied, logins asked: a store for a team and a cluster
	@# TEAM_STORE_HOST=0.0.0.0 for other machines (TEAM_STORE_ALLOWED_HOSTS=name,...: a TLS proxy's host names); PG_URI=postgresql+psycopg://USER@HOST:PORT/DB for an
	@# existing database (its password in a pgpass file, never in the URI); TEAM_STORE_NO_AUTH=1: no logins
	python scripts/team_store.py --dir $(TEAM_STORE_DIR) --host $(TEAM_STORE_HOST) --port $(TEAM_STORE_PORT) $(if $(PG_URI),--pg-uri $(PG_URI)) $(if $(filter 1,$(TEAM_STORE_NO_AUTH)),--no-auth-i-know)

bench: install          ## side-by-side benchmarks -> benchmarks/results/*.json
	python benchmarks/run_all.py

clean:
	rm -rf data/prepared data/tokens data/model data/train data/eval data/reports data/checkpoints
