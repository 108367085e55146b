# Feeding PyTorch from packed and sharded data: set-up, lab, tests.
# `make lab` and `make test` do all set-up on a fresh clone; every other target is a piece of them.

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
INSTALLED := $(VENV)/.installed
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
# pip on some machines warns about every package of an index folder that is not there: hide only that noise.
# Only grep's status is excused (it fails when nothing is left to print): a failed install still stops make.
QUIET_PIP := { grep -v "^WARNING: Location 'file:" || true; }

LESSON_DIRS := notebooks solutions exercises
SOURCES = $(wildcard $(addsuffix /[0-9][0-9]_*.md,$(LESSON_DIRS)))

.PHONY: help setup lab test check-install lint hooks data notebooks exercises exercises-check slides schedule bench bench-quick bench-gpu clean clean-data

help:  ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/; s/\$$\$$/$$/g' | expand -t 18

$(INSTALLED): requirements.txt pyproject.toml
	@test -x $(VENV)/bin/pip || { $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "Python 3.11 or newer is needed: run 'make $(MAKECMDGOALS) PYTHON=python3.11'" >&2; exit 1; }; \
		rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	@echo "Installing pinned dependencies into $(VENV) (first time: a few minutes)..."
	@$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt 2>&1 | $(QUIET_PIP)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e . 2>&1 | $(QUIET_PIP)
	@touch $@

$(LAB_SETTINGS): $(INSTALLED) src/packdata/course/hub.py
	@$(BIN)/packdata lab-settings > /dev/null

setup: $(INSTALLED) $(LAB_SETTINGS)  ## create .venv, install pins and packdata, open .md as notebooks in Lab

data: setup  ## generate the datasets if missing (shapes and photos) ($$PACKDATA_SIZE: workshop or small)
	@$(BIN)/packdata make-data && $(BIN)/packdata make-data --photos

notebooks: setup  ## write the .ipynb pair of every lesson, solution and exercise whose .md is newer
	@stale=$$(for md in $(SOURCES); do [ "$$md" -ot "$${md%.md}.ipynb" ] || echo "$$md"; done); \
	if [ -n "$$stale" ]; then $(BIN)/jupytext --quiet --update --to ipynb $$stale; fi

exercises: setup  ## regenerate exercises/ from solutions/
	@$(BIN)/packdata exercises

exercises-check: setup  ## fail when exercises/ has drifted from solutions/
	@$(BIN)/packdata exercises --check && echo "exercises/ is in sync with solutions/"

slides: setup data  ## build offline reveal.js decks into build/slides/
	@$(BIN)/packdata slides

schedule: setup data  ## time every lesson on this machine; rewrite the schedule in INSTRUCTORS.md
	@$(BIN)/packdata schedule

lab: setup data notebooks  ## set everything up and open JupyterLab on the course
	@echo "Starting JupyterLab on the course: open the http://127.0.0.1 URL printed below (Ctrl-C stops it)."
	@$(BIN)/jupyter lab --ip=127.0.0.1 $(if $(DISPLAY),,--no-browser) $(if $(filter 0,$(shell id -u)),--allow-root) \
		--ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks/00_welcome.md

test: export PACKDATA_SIZE := small
# notebook kernels start workers by forkserver, as Python 3.14 does on Linux (tests/start_method.py);
# tests/test_lessons.py runs every lesson once more by spawn, as on macOS (the forkserver preloads torch)
test: export PYTHONSTARTUP := $(abspath tests/start_method.py)
# the lessons run once, in tests/test_lessons.py, which keeps their executed decks for the browser test;
# two pytest-xdist workers share the work, a file or a set of lessons at a time (tests/conftest.py)
TEST_WORKERS ?= 2
test: setup data notebooks exercises-check check-install lint  ## set everything up and run every test (unit tests and notebooks)
	@$(BIN)/python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) \
		tests solutions exercises --nbval-lax --ignore=tests/install

check-install: setup  ## the pins agree in requirements.txt, environment.yml and .venv; `pip install .` works
	@$(BIN)/python -m pytest -p no:cacheprovider -q tests/install

lint: setup  ## ruff: lint and format check of the package, tests, benchmark and scripts
	@$(BIN)/ruff check --quiet . && $(BIN)/ruff format --check --quiet . && echo "ruff: clean"

hooks: setup  ## install the pre-commit hooks (ruff, jupytext sync) into this clone's .git
	@$(BIN)/pre-commit install

bench: setup data  ## every loader side by side, targets judged on the photos: build/bench/report.md (4 to 7 minutes on 2 quiet cores)
	@$(BIN)/python benchmarks/report.py

bench-quick: setup  ## the same on 100 photos and 500 shapes, to check that every loader runs (judges nothing)
	@$(BIN)/python benchmarks/report.py --small

bench-gpu: setup  ## the last hop to a CUDA GPU: pinned copies, non_blocking, how many workers feed ResNet-50
	@$(BIN)/python benchmarks/gpu.py

clean:  ## remove generated notebooks, slides, reports and caches: build/ but slurm-up's daemons' state (keeps .venv, data/)
	[ ! -d build ] || find build -mindepth 1 -maxdepth 1 ! -name slurm -exec rm -rf {} +
	rm -rf .pytest_cache
	find $(LESSON_DIRS) -name '*.ipynb' -delete
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

clean-data:  ## remove every generated dataset, archive and shard under data/
	find data -mindepth 1 -not -name README.md -delete

# Targets that start real services (Slurm, JupyterHub) live one per file in mk/.
-include mk/*.mk

# --- the peers lab: other tools' loaders beside ours, each in a side environment built on first use.
# `make test` never builds them and the course's .venv stays as it is; their pins are in
# benchmarks/peers/requirements*.txt. The '*' in each one's .gitignore keeps git and ruff out of it.
define PEERS_VENV
	@test -x $(@D)/bin/pip || { $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "Python 3.11 or newer is needed: run 'make $(MAKECMDGOALS) PYTHON=python3.11'" >&2; exit 1; }; \
		rm -rf $(@D) && $(PYTHON) -m venv $(@D) && echo '*' > $(@D)/.gitignore; }
	@echo "Installing $< into $(@D) (first time: a few minutes)..."
	@$(@D)/bin/python -m pip install -q --disable-pip-version-check -r $< 2>&1 | $(QUIET_PIP)
endef

.venv-peers/.installed: benchmarks/peers/requirements.txt requirements.txt pyproject.toml
	$(PEERS_VENV)
	@$(@D)/bin/python -m pip install -q --disable-pip-version-check --no-deps -e . 2>&1 | $(QUIET_PIP)
	@touch $@

.venv-mosaic/.installed: benchmarks/peers/requirements-mosaic.txt pyproject.toml
	$(PEERS_VENV)
	@$(@D)/bin/python -m pip install -q --disable-pip-version-check --no-deps -e . 2>&1 | $(QUIET_PIP)
	@touch $@

.PHONY: bench-peers bench-peers-quick
bench-peers: .venv-peers/.installed .venv-mosaic/.installed  ## ours beside webdataset, wids, LitData, HF datasets, torchdata.nodes, MosaicML: build/peers/report.md (about 6 min)
	@.venv-peers/bin/python benchmarks/peers/run.py

bench-peers-quick: .venv-peers/.installed .venv-mosaic/.installed  ## the same on 100 photos, one round: checks that every tool runs (judges nothing)
	@.venv-peers/bin/python benchmarks/peers/run.py --quick
