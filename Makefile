# The README's commands. `make demo` runs the tour notebook for real; `make test` runs the whole suite.
# TORCH: the torch requirement installed when the Python you run make with has no torch already
# (with one, the venv reuses it). 2.13.0 is a CPU build on the CI machines' local disk, and a CUDA
# build from PyPI on a Linux GPU machine; `make test TORCH=torch` takes the newest instead.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
VPY := $(VENV)/bin/python
# Colab's IPython: the oldest the package supports, tested in a venv of its own
OLD_VENV := .venv-ipython7
OLD_IPYTHON := ipython==7.34.0
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: venv demo lab test test-ipython7 lint browser-deps bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
	  echo "reusing the torch of $(PYTHON)"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	  $(PYTHON) -m venv $(VENV) && $(VPY) -m pip install -q --upgrade pip && $(VPY) -m pip install -q "$(TORCH)"; \
	fi
	$(VPY) -m pip install -q -e ".[test]"
	@touch $@

demo: venv
	$(VPY) notebooks/run.py notebooks/tour.ipynb --html notebooks/tour.html

lab: venv
	$(VENV)/bin/jupyter lab notebooks/tour.ipynb

# Debian's Chromium for the browser test (Playwright's own browser download does not work everywhere).
browser-deps:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

lint: venv
	$(VPY) -m ruff check torchgpu_magic tests benchmarks notebooks

test: venv browser-deps lint
	$(VPY) -m pytest -q $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-ipython7

# The shell-level suite again under IPython 7.34 (Colab); notebooks and the browser need a newer Jupyter.
test-ipython7: $(OLD_VENV)/.installed
	$(OLD_VENV)/bin/python -m pytest -q -p no:cacheprovider --ignore=tests/test_browser.py \
	  --ignore=tests/test_notebooks.py $(PYTEST_ARGS)

$(OLD_VENV)/.installed: pyproject.toml Makefile
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
	  $(PYTHON) -m venv --system-site-packages $(OLD_VENV); \
	else \
	  $(PYTHON) -m venv $(OLD_VENV) && $(OLD_VENV)/bin/python -m pip install -q "$(TORCH)"; \
	fi
	$(OLD_VENV)/bin/python -m pip install -q "$(OLD_IPYTHON)" pytest hypothesis numpy "ipywidgets>=8" -e .
	@touch $@

bench: venv
	for b in benchmarks/bench_*.py; do $(VPY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(OLD_VENV) notebooks/tour.html test-artifacts .pytest_cache .ruff_cache
