# The README's commands. `make demo` runs the tour notebook for real; `make test` runs the whole suite;
# `make dist` builds the sdist and wheel and checks them.
# TORCH: the torch requirement installed when the Python you run make with has no torch already
# (with one, the venv reuses it). 2.13.0 is a CPU build on the CI machines' local disk, and a CUDA
# build from PyPI on a Linux GPU machine; `make test TORCH=torch` takes the newest instead.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
VPY := $(VENV)/bin/python
# Colab's IPython, the oldest the package supports. Its venv is a thin layer over .venv: a .pth file puts
# .venv's site-packages on the path after its own, so it holds IPython 7.34 (and what only that needs)
# and shares .venv's torch, pytest and the rest instead of a second copy. It has no pip of its own either:
# `python -m pip` finds .venv's, which installs into the layer.
OLD_VENV := .venv-ipython7
OLD_IPYTHON := ipython==7.34.0
# build and twine, in a venv of their own: building the package needs neither torch nor Jupyter
DIST_VENV := .venv-dist
# `pip install -e .` makes setuptools print a 9-line "Editable installation" notice (a warning of its
# InformationOnly kind: nothing to act on) at every install; the installs here leave that one message out.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

.PHONY: venv demo lab test test-main test-ipython7 test-simulated test-simulated-mps test-simulated-xpu \
  test-simulated-rocm lint browser-deps dist bench pictures examples clean

# .venv and torch: the torch of $(PYTHON) when it has one (a CUDA build you installed keeps working).
# Installs for the demo use pip's --no-compile: bytecode is then written on first import for the modules
# the tour uses instead of at install for all of them (measured: 58 MB instead of 175, sympy's alone 51).
$(VENV)/.torch:
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
	  echo "reusing the torch of $(PYTHON)"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	  $(PYTHON) -m venv $(VENV) && $(VPY) -m pip install -q --upgrade pip && \
	  $(VPY) -m pip install -q --no-compile "$(TORCH)"; \
	fi
	@touch $@

# The package, editable, with what the tour needs (the `demo` extra) ...
$(VENV)/.demo: $(VENV)/.torch pyproject.toml Makefile
	$(EDITABLE) $(VPY) -m pip install -q --no-compile -e ".[demo]"
	@touch $@

# ... or with everything the tests need (the `test` extra, which includes `demo`), compiled: the tests
# start many interpreters, and where PYTHONDONTWRITEBYTECODE is set (CI) each would compile torch and the
# rest from source again. Left uncompiled (NO_BYTECODE) are the trees the tests barely import, to keep the
# venvs near 1.6 GB: sympy and pandas (about 80 MB of bytecode; torch does not import sympy at start-up),
# and transformers' hundreds of model folders but the ones the Hugging Face tests build (about 50 MB).
# A few files in torch are written for newer Pythons and do not compile here, as under pip:
# compile_dir's result is not a verdict on the venv.
NO_BYTECODE := /(sympy|pandas)/|/transformers/models/(?!(auto|bert|gpt2)/)
$(VENV)/.test: $(VENV)/.torch pyproject.toml Makefile
	$(EDITABLE) $(VPY) -m pip install -q --no-compile -e ".[test]"
	$(VPY) -c 'import compileall, re, sys, sysconfig; compileall.compile_dir(sysconfig.get_path("purelib"), quiet=2, workers=0, rx=re.compile(sys.argv[1]))' '$(NO_BYTECODE)'
	@touch $@ $(VENV)/.demo

venv: $(VENV)/.test

demo: $(VENV)/.demo
	$(VPY) notebooks/run.py notebooks/tour.ipynb --html notebooks/tour.html

lab: $(VENV)/.test
	$(VENV)/bin/jupyter lab notebooks/tour.ipynb

# Chromium for the browser test, where it can be had without touching the rest of the system: Debian's
# package through apt-get (as root, else with sudo), and only when apt's dry run (-s) shows that it
# upgrades or removes no installed package, except where the browser test is required (CI:
# TORCHGPU_MAGIC_REQUIRE_BROWSER=1), where chromium's hard dependencies may be upgraded (named in one line;
# no recommended packages). Anywhere else one line says why the browser test will be skipped (or fail,
# where it is required); this step itself never fails the build.
define BROWSER_DEPS
outcome="be skipped"
[ "$${TORCHGPU_MAGIC_REQUIRE_BROWSER:-}" = 1 ] && outcome="fail (TORCHGPU_MAGIC_REQUIRE_BROWSER=1)"
say() { echo "browser-deps: $$1; the browser test will $$outcome"; exit 0; }
for c in /usr/bin/chromium chromium chromium-browser; do command -v "$$c" >/dev/null && exit 0; done
command -v apt-get >/dev/null || say "no Chromium, and no apt-get to install it (put a chromium on PATH)"
sudo=
if [ "$$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || say "no Chromium, and apt-get needs root but there is no sudo"
  sudo=sudo
fi
$$sudo apt-get update -qq >/dev/null 2>&1 || say "no Chromium, and apt-get update failed"
plan=$$(apt-get -s install --no-install-recommends chromium 2>&1) || \
  say "no Chromium, and apt-get cannot install it ($$(echo "$$plan" | tail -n 1))"
changed=$$(echo "$$plan" | awk '/^Inst [^ ]+ \[/ || /^Remv / { printf "%s%s", sep, $$2; sep = ", " }')
if [ -n "$$changed" ] && [ "$${TORCHGPU_MAGIC_REQUIRE_BROWSER:-}" != 1 ]; then
  say "no Chromium: installing Debian's chromium would upgrade or remove installed packages ($$changed), so that is left to you"
fi
if [ -n "$$changed" ]; then
  echo "browser-deps: the browser test is required here (TORCHGPU_MAGIC_REQUIRE_BROWSER=1), so chromium is installed with what it strictly needs upgraded: $$changed"
else
  echo "browser-deps: installing Debian's chromium: $$(echo "$$plan" | grep -c '^Inst') new packages, none upgraded"
fi
# apt and debconf talk on both streams even with -qq (debconf: "delaying package configuration..."): kept,
# and shown only when the install fails
log=$$($$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium 2>&1) || \
  { echo "$$log" | tail -n 20; say "apt-get install chromium failed (its last lines above)"; }
endef
export BROWSER_DEPS

browser-deps:
	@sh -c "$$BROWSER_DEPS"

lint: $(VENV)/.test
	$(VPY) -m ruff check torchgpu_magic tests benchmarks notebooks docs

# `make test` runs every leg in TEST_LEGS, each a make target of its own, TEST_JOBS of them at once
# (default: the CPUs, at most 4; tests/run_legs.py), and every one of them even when another failed: one
# broken leg must not hide what the others would say. Each leg's output is printed whole when it ends (also
# in test-artifacts/legs/LEG.log); the run ends with one line per leg (passed or failed, and its seconds)
# and fails if any leg did. The legs are independent and none keeps two cores busy, so two at a time on two
# cores take two thirds of the time they take in turn. A new leg is a target added to the list
# (`TEST_LEGS += test-xyz`); list the long ones first.
TEST_LEGS := test-main test-ipython7 test-simulated test-simulated-xpu test-simulated-mps test-simulated-rocm \
  test-cudabuild lint
TEST_JOBS ?=

test: $(VENV)/.test browser-deps
	@$(VPY) tests/run_legs.py $(if $(TEST_JOBS),--jobs $(TEST_JOBS)) $(TEST_LEGS)

# The whole suite under this venv's IPython, notebooks and the browser included.
test-main: $(VENV)/.test
	$(VPY) -m pytest -q $(PYTEST_ARGS)

# The shell-level suite again under IPython 7.34 (Colab); notebooks and the browser need a newer Jupyter.
test-ipython7: $(OLD_VENV)/.installed
	$(OLD_VENV)/bin/python -m pytest -q -p no:cacheprovider --ignore=tests/test_browser.py \
	  --ignore=tests/test_notebooks.py $(PYTEST_ARGS)

# The suite a third time as on a machine with one H100 80GB and CUDA 13 (tests/simulated_gpu.py): torch.cuda
# answers as a CUDA build would before any kernel runs, NVML is the scripted h100, and a real CUDA tensor
# still fails. The gpu-marked tests skip (they run kernels). Notebooks and the browser run in kernels of
# their own, which the simulation does not reach, so they are left to the first leg. Where torch is a
# CUDA build there is nothing to simulate: one line says so (the gpu-marked tests run on its GPU).
test-simulated: $(VENV)/.test
	@if $(VPY) -c 'import sys, torch; sys.exit(torch.version.cuda is not None)'; then \
	  echo "$(VPY) -m pytest -q --simulate-gpu (one simulated H100)"; \
	  $(VPY) -m pytest -q --simulate-gpu --ignore=tests/test_browser.py --ignore=tests/test_notebooks.py \
	    $(PYTEST_ARGS); \
	else echo "test-simulated: skipped, this torch is a CUDA build: run the gpu-marked tests on its GPU"; fi

# The suite again, as test-simulated does, as on an Apple M2 Max Mac (mps), an Intel GPU Max 1100 (xpu) and
# an AMD MI300X under ROCm with AMD SMI and no NVML (rocm): tests/simulated_mps.py, simulated_xpu.py,
# simulated_rocm.py put each machine where a GPU build's C extension sits, every test runs as on it, and
# every magic is checked on it (tests/test_simulated_machines.py). A test that scripts a machine the
# simulated one cannot be (a CUDA build of torch, NVIDIA GPUs) skips there, saying so. Notebooks and the
# browser run in processes of their own, which the simulation does not reach, so they are left to the first
# leg. Skipped, with one line, where torch is a build for a GPU.
test-simulated-mps test-simulated-xpu test-simulated-rocm: test-simulated-%: $(VENV)/.test
	@if $(VPY) -c 'import sys, torch; sys.exit(torch.accelerator.current_accelerator() is not None)'; then \
	  echo "$(VPY) -m pytest -q --simulate $* (the suite as on that machine)"; \
	  $(VPY) -m pytest -q -p no:cacheprovider --simulate $* --ignore=tests/test_browser.py \
	    --ignore=tests/test_notebooks.py $(PYTEST_ARGS); \
	else echo "test-simulated-$*: skipped, this torch is a build for a GPU: it has its own backend"; fi

# Rebuilt from scratch whenever .venv changes (it is small): the layer, then IPython 7.34 and the package.
# Jupyter looks for data files (nbconvert's templates, kernelspecs) under sys.prefix/share/jupyter: the
# layer's is a link to .venv's, whose packages it uses.
$(OLD_VENV)/.installed: $(VENV)/.test
	rm -rf $(OLD_VENV)
	$(VPY) -m venv --without-pip \
	  $$(grep -q '^include-system-site-packages = true' $(VENV)/pyvenv.cfg && echo --system-site-packages) $(OLD_VENV)
	$(VPY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))' > \
	  "$$($(OLD_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/over-venv.pth"
	mkdir -p $(OLD_VENV)/share && ln -s ../../$(VENV)/share/jupyter $(OLD_VENV)/share/jupyter
	$(EDITABLE) $(OLD_VENV)/bin/python -m pip install -q "$(OLD_IPYTHON)" -e .
	@touch $@

# ---- the CUDA-build leg -------------------------------------------------------------------------
# What a bare `pip install torch` gives a Linux machine without an NVIDIA GPU (or without its driver): a
# CUDA build of torch, whose torch.cuda.is_available() is False. Every other leg runs on a CPU build (or
# simulates a GPU over one), so this one runs, on the real CUDA build, the tests marked `cudabuild`: those
# where the build matters (%gpuinfo's causes, device choice, --predict cuda without the CPU stand-in,
# load/unload, the tour notebook). Its venv is a layer over .venv as .venv-ipython7 is (a .pth puts .venv's
# site-packages after its own), holding CUDA_TORCH and the nvidia-* libraries it pulls in, and the package
# itself again (an editable install's .pth in .venv is not read through the layer). 2.14.1 lies on the CI
# machines' local disk; pip compiles its bytecode at install, since every test starts interpreters.
CUDA_VENV := .venv-cudabuild
CUDA_TORCH := torch==2.14.1

.PHONY: test-cudabuild

$(CUDA_VENV)/.installed: $(VENV)/.test
	rm -rf $(CUDA_VENV)
	$(VPY) -m venv --without-pip \
	  $$(grep -q '^include-system-site-packages = true' $(VENV)/pyvenv.cfg && echo --system-site-packages) $(CUDA_VENV)
	$(VPY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))' > \
	  "$$($(CUDA_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/over-venv.pth"
	mkdir -p $(CUDA_VENV)/share && ln -s "$(abspath $(VENV))/share/jupyter" $(CUDA_VENV)/share/jupyter
	$(CUDA_VENV)/bin/python -m pip install -q "$(CUDA_TORCH)"
	$(EDITABLE) $(CUDA_VENV)/bin/python -m pip install -q --no-deps -e .
	@touch $@

# On a machine with an NVIDIA driver there is nothing to check here (no GPU is what this leg is about): one
# line says so, as test-simulated does on a CUDA build, and the layer is not built. Otherwise the layer is
# checked to hold what the leg is for before its tests run, so that it cannot pass on the wrong torch.
ifeq ($(wildcard /proc/driver/nvidia/version),)
test-cudabuild: $(CUDA_VENV)/.installed
	@$(CUDA_VENV)/bin/python -c 'import sys, torch; sys.exit(None if torch.version.cuda and not \
	  torch.cuda.is_available() else f"test-cudabuild: needs a CUDA build that finds no GPU, not {torch.__version__}")'
	@echo "$(CUDA_VENV)/bin/python -m pytest -q -m cudabuild ($(CUDA_TORCH), a CUDA build, no GPU)"
	@$(CUDA_VENV)/bin/python -m pytest -q -p no:cacheprovider -m cudabuild $(PYTEST_ARGS)
else
test-cudabuild:
	@echo "test-cudabuild: skipped, this machine has an NVIDIA driver: run the gpu-marked tests on its GPU"
endif

# The sdist and wheel as they would be published (isolated build), failing on any warning the build
# prints; then twine's metadata and README checks, and a wheel that holds the package and nothing else.
# PYTHONDONTWRITEBYTECODE is cleared for the build: with it set, setuptools warns that it skips byte-compiling.
$(DIST_VENV)/.installed:
	$(PYTHON) -m venv $(DIST_VENV) && $(DIST_VENV)/bin/python -m pip install -q build twine
	@touch $@

dist: $(DIST_VENV)/.installed
	rm -rf dist && mkdir dist
	@echo "python -m build --outdir dist (output in dist/build.log)"
	@PYTHONDONTWRITEBYTECODE= $(DIST_VENV)/bin/python -m build --outdir dist . >dist/build.log 2>&1 || \
	  { tail -n 40 dist/build.log; exit 1; }
	@if grep -i warn dist/build.log; then echo "make dist: the build printed the warnings above"; exit 1; fi
	$(DIST_VENV)/bin/python -m twine check --strict dist/*.whl dist/*.tar.gz
	@$(DIST_VENV)/bin/python -c 'import sys, zipfile; \
	  names = zipfile.ZipFile(sys.argv[1]).namelist(); \
	  extra = [n for n in names if n.split("/")[0] != "torchgpu_magic" and ".dist-info/" not in n]; \
	  sys.exit("make dist: the wheel holds more than the package: " + ", ".join(extra) if extra else 0)' dist/*.whl
	@echo "make dist: $$(cd dist && ls *.whl *.tar.gz | tr '\n' ' ')checked"

bench: $(VENV)/.test
	for b in benchmarks/bench_*.py; do $(VPY) $$b || exit 1; done

# The docs' example outputs, run again and written where their text changed (docs/examples.py), and the
# docs' pictures taken again from real runs (docs/images/pictures.py); docs/development.md says more.
examples: $(VENV)/.test
	$(VPY) docs/examples.py --write

pictures: $(VENV)/.test browser-deps
	$(VPY) docs/images/pictures.py

# `make gpu-check OUT=dir`: the whole GPU validation in one command (docs/gpu-validation.md): the checks'
# figures against their references, pytest -m gpu, the benchmarks' GPU modes and the tour, each step under
# a time limit and all under 450 s; a log per step and dir/summary.md. It runs with $(PYTHON) as it is, not
# in make test's venvs: a GPU machine has torch and the runtime dependencies, and no package index.
# GPU_CHECK_ARGS: more options (--only, --skip, --deadline; `$(PYTHON) -m torchgpu_magic.check --help`).
.PHONY: gpu-check
OUT ?= test-artifacts/gpu-check
gpu-check:
	$(PYTHON) -m torchgpu_magic.check --out "$(OUT)" $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(OLD_VENV) $(DIST_VENV) dist build notebooks/tour.html test-artifacts .pytest_cache .ruff_cache
