# gpulab — one target per user task. CI runs `make test` (see .ci/run).
#
#   make lab        install what a learner needs (once), start the cluster, open JupyterLab
#   make test       everything CI checks: unit, cluster, notebook and browser tests, after installing
#                   the test tools (BACKEND=kind: against a kind cluster; needs Docker, see README)
#   make install    the learner's install only: .venv with gpulab and its kernel (the CJK font for Chinese
#                   plot labels comes with it, as a Python package: no root needed) and JupyterLab in
#                   Chinese; make lab runs it
#   make install-test   the test tools on top: pytest, nbval, playwright... and, as root or with sudo,
#                   Debian's chromium and fonts-noto-cjk for tests/browser; make test and make test-* run it
#   GPULAB_BIN_DIR=dir make lab   ready control-plane binaries instead of building them (no Go needed;
#                   `gpulab build` checks each binary and its version); the same for make test
#   make test-learner   (as an ordinary account; .ci/as-learner runs it) the GPU stack, notebooks 01-04,
#                   lab 02, the monitoring add-on; make test-learner-process: workloads, notebooks 01 and 05 in GPULAB_SANDBOX=process
#   make notebooks  re-run all notebooks in order on one fresh cluster and store their outputs
#                   (NB="03 05": only those, on the current cluster)
#   make labs       regenerate labs/ from solutions/ (a test fails when they drift)
#   make messages   bring the CLI's zh_CN catalog (gpulab/locale/) in line with the messages marked in gpulab/;
#                   then translate the new ones (a test fails until every one is; DEVELOPMENT.md says how)
#   make grade LAB=03 SUBMISSIONS=dir [HIDDEN=dir] [OUT=dir] [LEARNER="a b"]   grade a class (or some
#                   learners) into a gradebook; other learners' rows already in OUT's gradebook stay
#   make bench      benchmarks; results go into BENCHMARKS.md by hand (make bench-soak: SIGKILL every
#                   component 20 times on a fresh cluster, check nothing is lost)
#   make down       stop the cluster (state kept);  make purge  deletes it

SHELL := /bin/bash
# The first interpreter >= 3.11 that actually runs (pyenv shims may exist for versions that do not).
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11; do $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` and `make test-learner`: each worker starts its own cluster and is
# given whole test modules (--dist loadscope: a module's fixtures are set up once); the notebooks come
# first (tests/conftest.py), so the longest module starts at once. The cluster tests mostly wait on
# controllers and timers, so two workers share the 2 cores well. TEST_WORKERS=0: one process, no xdist.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope)
JUPYTER_PORT ?= 8888
# embedded (local processes) or kind (Docker): which cluster `make up` / `make test` use.
BACKEND ?= embedded
CHECK_BACKEND = @case "$(BACKEND)" in embedded) ;; \
	kind) docker info >/dev/null 2>&1 || { echo "gpulab: BACKEND=kind needs Docker with a running daemon" \
	      "(\`docker info\` fails here): install or start Docker, or use the embedded backend (BACKEND=embedded)"; exit 1; } ;; \
	*) echo "gpulab: BACKEND=$(BACKEND): unknown backend; allowed: embedded, kind"; exit 2 ;; esac

.PHONY: help install install-test build up down purge reset status lab test test-unit test-cluster test-notebooks \
        test-learner test-learner-process \
        notebooks labs messages grade bench bench-grading bench-soak clean

help:
	@sed -n 's/^#   //p' Makefile

# Go builds the control plane once (`gpulab build`); with GPULAB_BIN_DIR nothing is built and Go is not needed.
NEED_GO = @command -v go >/dev/null || { echo "gpulab: Go >= 1.26 is needed to build the control plane once;" \
	  "install Go, or set GPULAB_BIN_DIR to a directory of ready binaries (see README)"; exit 1; }
# $(call APT_GET,packages,what is missing,what for,what happens without): installs Debian packages where
# apt-get may (root, or passwordless sudo), else says how; never fails the target.
APT_GET = if command -v apt-get >/dev/null && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
	    sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	    echo "gpulab: installing Debian's $(1) ($(3))"; \
	    { $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $(1) >/dev/null; } \
	      || echo "gpulab: apt-get could not install $(1): $(4)"; \
	  else \
	    echo "gpulab: no $(2), and apt-get needs root here: $(4)" \
	         "(install it with: sudo apt-get install -y $(1))"; \
	  fi
# The learner's install (make lab, make up): gpulab with its runtime dependencies, and the notebook kernel.
$(STAMP): pyproject.toml constraints.txt
	@test -n "$(PYTHON)" || { echo "gpulab: Python >= 3.11 is needed; set PYTHON=/path/to/python3.11"; exit 1; }
	$(if $(GPULAB_BIN_DIR),,$(NEED_GO))
	@command -v unshare >/dev/null || { echo "gpulab: unshare (util-linux) is needed to run pod commands"; exit 1; }
	@# nft (Debian's nftables): kube-proxy programs Services with it in the pod network (off a learner's PATH, in /usr/sbin).
	@PATH="$$PATH:/usr/sbin:/sbin" command -v nft >/dev/null || { \
	  $(call APT_GET,nftables,nft,for kube-proxy's Services,Services will not work: gpulab up stops and says so); }
	@# nginx and busybox (Debian's nginx-light and busybox): the programs of the nginx and busybox images.
	@{ PATH="$$PATH:/usr/sbin:/sbin" command -v nginx && command -v busybox; } >/dev/null || { \
	  $(call APT_GET,nginx-light busybox,nginx or busybox,for the nginx and busybox images,pods of those images will not start and their events say so); }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (gpulab)" >/dev/null
	@# Chinese labels in notebook plots need no apt: the noto-cjk-sans-otc dependency ships the font (gpulab/notebook/plots.py).
	@# GPULAB_SANDBOX=process (no user namespaces here) places pods' volumes with proot.
	@[ "$$GPULAB_SANDBOX" != process ] || command -v proot >/dev/null || { 	  $(call APT_GET,proot,proot,for GPULAB_SANDBOX=process,pods with volumes cannot start in the process sandbox); }
	touch $(STAMP)

# The test tools on top (make test, make test-*): pyproject's dev extra.
$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(TEST_STAMP)

# JupyterLab's default language for the course is Chinese: the zh-CN language pack is a dependency, and this settings
# override (in overrides.d/ of the environment's JupyterLab settings, beside any other package's) makes zh_CN the
# default; a learner's own choice (设置 > 语言 / Settings > Language) still wins. postBuild installs it for images.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/gpulab.json
$(LAB_OVERRIDES): jupyterlab-overrides.json
	install -D -m 0644 $< $@

install: $(STAMP) $(LAB_OVERRIDES)

install-test: $(TEST_STAMP)
	@# The browser test (tests/browser) drives JupyterLab in Debian's chromium; playwright cannot download one here.
	@# fonts-noto-cjk: Chromium's font for the Chinese text of the quiz and the notebooks in their screenshots.
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  $(call APT_GET,chromium fonts-noto-cjk,chromium,for tests/browser,tests/browser will be skipped); }
	@fc-list ':lang=zh-cn' 2>/dev/null | grep -q . || { \
	  $(call APT_GET,fonts-noto-cjk,CJK font for Chromium,for tests/browser,tests/browser will find glyph boxes in Chinese text); }
	@# proot: the tests of the weaker process sandbox (GPULAB_SANDBOX=process).
	@command -v proot >/dev/null || { \
	  $(call APT_GET,proot,proot,for the process sandbox's tests,the process sandbox's tests will be skipped); }

build: install
	$(BIN)/gpulab build

# `gpulab up` builds what a cluster needs to start; the rest (`gpulab build`) is for tests.
up: install
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

# gpulab jupyter: JupyterLab whose terminals have gpulab, kubectl 1.37 and the cluster's KUBECONFIG, as a lesson has.
lab: up
	$(BIN)/gpulab build --background
	$(BIN)/gpulab jupyter --ServerApp.ip=127.0.0.1 --ServerApp.port=$(JUPYTER_PORT) \
	    --ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/notebooks \
	    $(if $(filter 0,$(shell id -u)),--allow-root)

test: install-test build
	$(CHECK_BACKEND)
	GPULAB_TEST_BACKEND=$(BACKEND) $(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

test-unit: install-test
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-cluster: install-test build
	$(CHECK_BACKEND)
	GPULAB_TEST_BACKEND=$(BACKEND) $(BIN)/python -m pytest tests/cluster $(PYTEST_ARGS)

test-notebooks: install-test build
	$(BIN)/python -m pytest tests/notebooks $(PYTEST_ARGS)

# What .ci/as-learner runs as an ordinary account (learners are not root): the GPU stack's cluster
# tests, notebooks 01-04 and lab 02's grading; then workloads and notebooks 01, 05 in the process sandbox.
LEARNER_TESTS := tests/cluster/test_pod_network.py tests/cluster/test_gpu_operator.py tests/cluster/test_gpu_sharing.py tests/cluster/test_gpu_mig.py \
	tests/cluster/test_gpu_faults.py tests/cluster/test_lab_02.py tests/cluster/test_images.py tests/cluster/test_monitoring_addon.py \
	tests/notebooks/test_notebooks.py
test-learner: install-test build
	$(BIN)/python -m pytest $(XDIST) $(LEARNER_TESTS) -k "not test_notebook_runs or 01- or 02- or 03- or 04-" $(PYTEST_ARGS)

test-learner-process: install-test build
	GPULAB_SANDBOX=process $(BIN)/python -m pytest tests/unit/test_sandbox.py tests/cluster/test_workloads.py \
	    tests/notebooks/test_notebooks.py -k "test_sandbox or test_workloads or 01- or 03-" $(PYTEST_ARGS)

# No NB: all notebooks, in order, on one fresh cluster of their own (a temporary GPULAB_HOME, removed after);
# NB="03 05": those, on the current cluster (started first, as make up does).
notebooks: build
	$(if $(NB),$(CHECK_BACKEND))
	$(if $(NB),$(BIN)/gpulab up $(if $(filter kind,$(BACKEND)),--backend kind))
	$(BIN)/python tools/run_notebooks.py $(NB)

labs: install
	$(BIN)/gpulab labs generate

messages: install
	$(BIN)/python tools/messages.py

grade: up
	@test -n "$(LAB)" -a -n "$(SUBMISSIONS)" || { echo "usage: make grade LAB=03 SUBMISSIONS=dir [HIDDEN=dir] [OUT=dir] [LEARNER=\"a b\"]"; exit 2; }
	$(BIN)/gpulab grade $(SUBMISSIONS) --lab $(LAB) $(if $(HIDDEN),--hidden $(HIDDEN)) --out $(or $(OUT),grades/$(LAB)) $(foreach l,$(LEARNER),--learner $(l))

bench: build
	$(BIN)/python bench/cluster_bench.py

bench-soak: build
	$(BIN)/python bench/crash_soak.py --fresh

bench-grading: build
	$(BIN)/python bench/grading_bench.py --reset-compare

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
