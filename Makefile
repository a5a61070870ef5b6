PY ?= python3
# Everything runs in a venv of its own, with prescreen installed from a built
# wheel (non-editable), as users install it. Delete .venv to start afresh.
VENV ?= .venv
VPY := $(VENV)/bin/python
# Pin the CPU build that lies on local disk; a range would pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.*
PIP_FLAGS ?= -q --disable-pip-version-check
CACHE ?= .prescreen-demo

.PHONY: venv install dev test demo bench lint redis clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install $(PIP_FLAGS) "$(TORCH_PIN)"

venv: $(VPY)

# Build the wheel and install it (with the test tools) non-editable into the venv.
install: $(VPY)
	rm -rf dist build
	$(VPY) -m pip wheel $(PIP_FLAGS) --no-deps -w dist .
	$(VPY) -m pip install $(PIP_FLAGS) "$(TORCH_PIN)" "$$(ls dist/prescreen-*.whl)[test]"
	$(VPY) -m pip install $(PIP_FLAGS) --force-reinstall --no-deps dist/prescreen-*.whl
	rm -rf build

# An editable install into the current Python, for working on prescreen itself.
dev:
	$(PY) -m pip install $(PIP_FLAGS) "$(TORCH_PIN)"
	$(PY) -m pip install $(PIP_FLAGS) -e ".[test]"

# -P: the repository is not on sys.path, so tests import the installed wheel.
test: lint
	PRESCREEN_TEST_INSTALLED=1 $(VPY) -P -m pytest -q -p no:cacheprovider tests

# The example MLP over two batch families on a device of 19 MiB (a budget of 4.75 MiB): at batch (2048, 4096]
# its first GEMM's benchmark needs 5.0 MiB and falls back, its second needs 4.5 MiB and tunes, as does every
# GEMM of the smaller family (measured: 3 tuned, 1 fell back; two compiles, about 25 s on 2 CPU cores).
DEMO_WARM := warm examples/tiny_models.py:mlp --shape batch=2048..4096 --device-memory 19MiB \
	--inductor-config freezing=True
demo: install
	PRESCREEN_CACHE_DIR=$${PRESCREEN_CACHE_DIR:-$(CACHE)} $(VENV)/bin/prescreen $(DEMO_WARM)
	@echo "--- a second process compiling the same model reuses every decision:"
	PRESCREEN_CACHE_DIR=$${PRESCREEN_CACHE_DIR:-$(CACHE)} $(VENV)/bin/prescreen $(DEMO_WARM)
	PRESCREEN_CACHE_DIR=$${PRESCREEN_CACHE_DIR:-$(CACHE)} $(VENV)/bin/prescreen inspect
	PRESCREEN_CACHE_DIR=$${PRESCREEN_CACHE_DIR:-$(CACHE)} $(VENV)/bin/prescreen report
	PRESCREEN_CACHE_DIR=$${PRESCREEN_CACHE_DIR:-$(CACHE)} $(VENV)/bin/prescreen stats

bench: install
	$(VPY) -P bench/bench_import.py
	$(VPY) -P bench/bench_estimate.py
	$(VPY) -P bench/bench_vs_upstream.py
	$(VPY) -P bench/bench_store.py
	$(VPY) -P bench/bench_cold_lookup.py
	$(VPY) -P bench/bench_hooks.py

# mypy sees the package as it is installed: hooks/ is the import package prescreen.hooks.
TYPECHECK := build/typecheck
lint: install
	$(VPY) -m ruff check prescreen hooks _prescreen_autoload.py tests bench examples
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK) && cp -r prescreen $(TYPECHECK)/ && cp -r hooks $(TYPECHECK)/prescreen/hooks && cp _prescreen_autoload.py $(TYPECHECK)/
	cd $(TYPECHECK) && ../../$(VPY) -m mypy --config-file ../../pyproject.toml prescreen _prescreen_autoload.py

clean:
	rm -rf $(CACHE) build dist *.egg-info .pytest_cache
