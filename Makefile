# Set-up and day-to-day commands. Every target creates its own virtual environment (.venv)
# when it is missing and installs what it needs once (stamp files under .venv/.stamps, redone
# when pyproject.toml changes), so re-runs start at once.
#
#   make demo       the main job: every estimator x every available backend, agreement + timing
#                   (without a GPU, Triton runs through the interpreter on a small rollout), then
#                   a short learning-curve parity check (CleanRL-style PPO on CartPole, reference
#                   backend vs ours, 2 seeds; examples/parity/quick.py, about 1-2 min on a CPU)
#   make test       ruff lint + format check, then the test suite (Triton kernels through the
#                   Triton interpreter on CPU; tests marked `gpu` are deselected)
#   make test-gpu   the whole test suite on a CUDA machine, `gpu` tests included, no interpreter
#   make bench-cpu  the benchmark harness on the CPU (torch backend vs SB3's loop and TorchRL)
#   make bench-gpu  the benchmark harness on a CUDA GPU (quick grid; see docs/benchmarks.md)
#
# Variables: PYTHON (interpreter that creates the venv), VENV (its folder), PYTEST_ARGS.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PYTEST_ARGS ?=

PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMPS := $(VENV)/.stamps
# Without an NVIDIA GPU, install this CPU build of torch before anything else: an unpinned
# torch from PyPI would be a multi-GB CUDA build. With a GPU, the venv also sees the packages
# of the interpreter that created it (the system's, or those of the venv it belongs to), so a
# CUDA torch/triton already installed there is reused (no download; the GPU targets then also
# work on a machine without a package index); where there is none, pip installs one.
TORCH_CPU_VERSION ?= 2.13.0
HAS_NVIDIA_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
VENV_FLAGS := $(if $(HAS_NVIDIA_GPU),--system-site-packages,)
# The package is built with the venv's setuptools (no isolated build env to download).
PIP_INSTALL := $(PIP) install -q --no-build-isolation

.PHONY: help demo test lint test-gpu bench-cpu bench-gpu venv clean

help:
	@echo "make demo       run the demo (creates .venv, installs the package)"
	@echo "make test       ruff + the test suite on CPU (creates .venv, installs '.[test]')"
	@echo "make test-gpu   the whole test suite on a CUDA machine, gpu-marked tests included"
	@echo "make bench-cpu  benchmark harness on the CPU (installs '.[bench]')"
	@echo "make bench-gpu  benchmark harness on a CUDA GPU, quick grid (installs '.[bench]')"
	@echo "make clean      remove .venv and caches"

$(PY):
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
ifeq ($(HAS_NVIDIA_GPU),1)
	$(PYTHON) -c 'import site; print("\n".join(site.getsitepackages()))' \
	  > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_parent_site.pth"
endif

venv: $(STAMPS)/base

$(STAMPS)/base: | $(PY)
	@mkdir -p $(STAMPS)
ifeq ($(HAS_NVIDIA_GPU),1)
	@echo "NVIDIA GPU found: torch comes from the system or from the package's requirements"
	$(PIP) install -q "setuptools>=64"
else
	@echo "No NVIDIA GPU: installing the CPU build torch==$(TORCH_CPU_VERSION)"
	$(PIP) install -q "torch==$(TORCH_CPU_VERSION)" "setuptools>=64"
endif
	@touch $@

# numpy: the Triton interpreter (TRITON_INTERPRET=1, the demo's CPU path) imports it.
$(STAMPS)/demo: pyproject.toml $(STAMPS)/base
	$(PIP_INSTALL) -e '.[cleanrl]' numpy matplotlib
	@touch $@

$(STAMPS)/test: pyproject.toml $(STAMPS)/base
	$(PIP_INSTALL) -e '.[test]'
	@touch $@

# The GPU suite needs no ruff: only what runs the tests.
$(STAMPS)/test-gpu: pyproject.toml $(STAMPS)/base
	$(PIP_INSTALL) -e . pytest hypothesis numpy
	@touch $@

$(STAMPS)/bench: pyproject.toml $(STAMPS)/base
	$(PIP_INSTALL) -e '.[bench]'
	@touch $@

# Without a GPU the demo runs the Triton kernels too, through the Triton interpreter (on a
# smaller rollout: the interpreter is slow), so every backend is shown agreeing.
demo: $(STAMPS)/demo
	$(if $(HAS_NVIDIA_GPU),,TRITON_INTERPRET=1) $(PY) examples/demo.py
	$(PY) examples/parity/quick.py

lint: $(STAMPS)/test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n auto -m "not gpu" $(PYTEST_ARGS)

test-gpu: $(STAMPS)/test-gpu
	env -u TRITON_INTERPRET $(PY) -m pytest -q $(PYTEST_ARGS)

bench-cpu: $(STAMPS)/bench
	$(PY) benchmarks/harness.py --device cpu

bench-gpu: $(STAMPS)/bench
	$(PY) benchmarks/harness.py --device cuda

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
