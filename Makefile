# gpulab — one target per user task. CI runs `make test` (see .ci/run).
#
#   make lab        install what is missing, start the cluster, open JupyterLab
#   make test       everything CI checks: unit, cluster and notebook tests
#                   (BACKEND=kind: against a kind cluster; needs Docker, see README)
#   make notebooks  re-run the notebooks and store their outputs (NB="03 05" picks some)
#   make labs       regenerate labs/ from solutions/ (a test fails when they drift)
#   make grade LAB=03 SUBMISSIONS=dir [HIDDEN=dir] [OUT=dir] [LEARNER="a b"]   grade a class (or some
#                   learners) into a gradebook; other learners' rows already in OUT's gradebook stay
#   make bench      benchmarks; results go into BENCHMARKS.md by hand
#   make down       stop the cluster (state kept);  make purge  deletes it

SHELL := /bin/bash
# The first interpreter >= 3.11 that actually runs (pyenv shims may exist for versions that do not).
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11; do $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
JUPYTER_PORT ?= 8888
# embedded (local processes) or kind (Docker): which cluster `make up` / `make test` use.
BACKEND ?= embedded
CHECK_BACKEND = @case "$(BACKEND)" in embedded) ;; \
	kind) docker info >/dev/null 2>&1 || { echo "gpulab: BACKEND=kind needs Docker with a running daemon" \
	      "(\`docker info\` fails here): install or start Docker, or use the embedded backend (BACKEND=embedded)"; exit 1; } ;; \
	*) echo "gpulab: BACKEND=$(BACKEND): unknown backend; allowed: embedded, kind"; exit 2 ;; esac

.PHONY: help install build up down purge reset status lab test test-unit test-cluster test-notebooks \
        notebooks labs grade bench bench-grading clean

help:
	@sed -n 's/^#   //p' Makefile

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "gpulab: Python >= 3.11 is needed; set PYTHON=/path/to/python3.11"; exit 1; }
	@command -v go >/dev/null || { echo "gpulab: Go >= 1.26 is needed to build the control plane (or set GPULAB_BIN_DIR)"; exit 1; }
	@command -v unshare >/dev/null || { echo "gpulab: unshare (util-linux) is needed to run pod commands"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (gpulab)" >/dev/null
	touch $(STAMP)

install: $(STAMP)
	@# The browser test (tests/browser) drives JupyterLab in Debian's chromium; playwright cannot download one here.
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  if command -v apt-get >/dev/null && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
	    sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	    echo "gpulab: installing Debian's chromium and fonts-noto-cjk (for tests/browser)"; \
	    { $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq chromium fonts-noto-cjk >/dev/null; } \
	      || echo "gpulab: apt-get could not install chromium: tests/browser will be skipped"; \
	  else \
	    echo "gpulab: no chromium, and apt-get needs root here: tests/browser will be skipped" \
	         "(install it with: sudo apt-get install -y chromium fonts-noto-cjk)"; \
	  fi; }

build: install
	$(BIN)/gpulab build

up: build
	$(CHECK_BACKEND)
	$(BIN)/gpulab up $(if $(filter kind,$(BACKEND)),--backend kind)

down:
	-$(BIN)/gpulab down

purge:
	-$(BIN)/gpulab down --purge

reset: build
	$(BIN)/gpulab reset

status:
	$(BIN)/gpulab status

lab: up
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(JUPYTER_PORT) \
	    --ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/notebooks \
	    $(if $(filter 0,$(shell id -u)),--allow-root)

test: build
	$(CHECK_BACKEND)
	GPULAB_TEST_BACKEND=$(BACKEND) $(BIN)/python -m pytest $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-cluster: build
	$(CHECK_BACKEND)
	GPULAB_TEST_BACKEND=$(BACKEND) $(BIN)/python -m pytest tests/cluster $(PYTEST_ARGS)

test-notebooks: build
	$(BIN)/python -m pytest tests/notebooks $(PYTEST_ARGS)

notebooks: up
	$(BIN)/python tools/run_notebooks.py $(NB)

labs: install
	$(BIN)/gpulab labs generate

grade: up
	@test -n "$(LAB)" -a -n "$(SUBMISSIONS)" || { echo "usage: make grade LAB=03 SUBMISSIONS=dir [HIDDEN=dir] [OUT=dir] [LEARNER=\"a b\"]"; exit 2; }
	$(BIN)/gpulab grade $(SUBMISSIONS) --lab $(LAB) $(if $(HIDDEN),--hidden $(HIDDEN)) --out $(or $(OUT),grades/$(LAB)) $(foreach l,$(LEARNER),--learner $(l))

bench: build
	$(BIN)/python bench/cluster_bench.py

bench-grading: build
	$(BIN)/python bench/grading_bench.py --reset-compare

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
