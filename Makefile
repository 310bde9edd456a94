# `make run` and `make test` work on a fresh machine: they build .venv and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The GPU extra only where a driver answers; CuPy then needs a CUDA toolkit new enough for the GPU.
GPU_EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo ",gpu")

.PHONY: run test fuzz venv fetch-default install-desktop clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test$(GPU_EXTRA)]"
	touch $(STAMP)

venv: $(STAMP)

fetch-default: $(STAMP)
	$(PY) -m engine fetch-default

run: fetch-default
	$(PY) -m engine doctor
	$(VENV)/bin/lanechat

test: fetch-default
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

# Not part of `make test`: mutated inputs for FUZZ_SECONDS (default 600), niced, one case at a time.
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	nice -n 19 $(PY) tests/fuzz.py --seconds $(FUZZ_SECONDS) $(FUZZ_ARGS)

install-desktop: $(STAMP)
	bash packaging/install-desktop.sh

clean:
	rm -rf $(VENV) build *.egg-info
