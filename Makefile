# `make run` and `make test` work on a fresh machine: they build .venv and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
comma := ,
# The CuPy for this machine's driver (cuda13, cuda12, or one of them with -toolkit: CUDA libraries
# from pip where the system's are missing or too old for the GPU); empty without a usable driver.
# engine/gpu_select.py --explain says why.
GPU_EXTRA := $(shell $(PYTHON) -I engine/gpu_select.py)
EXTRAS := test$(if $(GPU_EXTRA),$(comma)$(GPU_EXTRA))

.PHONY: run test test-fast lint fuzz venv fetch-default install-desktop clean FORCE

# Holds the extras of the last install, rewritten only when they change (a new driver, say), so the
# venv is rebuilt then and not on every run.
$(VENV)/.extras: FORCE
	@mkdir -p $(VENV)
	@[ "$$(cat $@ 2>/dev/null)" = "$(EXTRAS)" ] || echo "$(EXTRAS)" > $@

$(STAMP): pyproject.toml $(VENV)/.extras
	@$(PYTHON) -I engine/gpu_select.py --explain
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@stale="$$($(PY) -I engine/gpu_select.py --stale "$(GPU_EXTRA)")"; \
		if [ -n "$$stale" ]; then echo "removing $$stale (not the CuPy for this driver)"; \
		$(PY) -m pip uninstall -q -y $$stale; fi
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

venv: $(STAMP)

fetch-default: $(STAMP)
	$(PY) -m engine fetch-default

run: fetch-default
	$(PY) -m engine doctor
	$(VENV)/bin/lanechat

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# pytest-xdist: one worker a core where there is no GPU (CI); with one, a single process, so that
# GPU tests never share the device. PYTEST_WORKERS=N overrides; worksteal evens out the long tests
# (the default model's gates, the NVRTC compiles) at the end.
PYTEST_WORKERS ?= $(if $(GPU_EXTRA),0,auto)
PYTEST := QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# Everything: lint, then every test (GPU tests skip without a device).
test: fetch-default lint
	$(PYTEST)

# Lint, then the tests without the `slow` ones (those run the embedded default model end to end).
test-fast: lint
	$(PYTEST) -m "not slow"

# Not part of `make test`: mutated inputs for FUZZ_SECONDS (default 600), niced, one case at a time.
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	nice -n 19 $(PY) tests/fuzz.py --seconds $(FUZZ_SECONDS) $(FUZZ_ARGS)

install-desktop: $(STAMP)
	bash packaging/install-desktop.sh

clean:
	rm -rf $(VENV) build *.egg-info
