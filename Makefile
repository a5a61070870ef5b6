PY ?= python3
PIP ?= $(PY) -m pip
# Pin the CPU build that lies on local disk; a range would pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.*

.PHONY: install test demo bench lint redis clean

install:
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[test]"

test: install
	$(PY) -m ruff check prescreen hooks tests bench examples
	$(PY) -m pytest -q -p no:cacheprovider tests

demo: install
	PRESCREEN_CACHE_DIR=$${PRESCREEN_CACHE_DIR:-.prescreen-demo} prescreen warm examples/tiny_models.py:mlp \
		--shape batch=1..4096 --device-memory 64GiB --inductor-config freezing=True
	@echo "--- a second process compiling the same model reuses every decision:"
	PRESCREEN_CACHE_DIR=$${PRESCREEN_CACHE_DIR:-.prescreen-demo} prescreen warm examples/tiny_models.py:mlp \
		--shape batch=1..4096 --device-memory 64GiB --inductor-config freezing=True
	PRESCREEN_CACHE_DIR=$${PRESCREEN_CACHE_DIR:-.prescreen-demo} prescreen inspect
	PRESCREEN_CACHE_DIR=$${PRESCREEN_CACHE_DIR:-.prescreen-demo} prescreen stats

bench: install
	$(PY) bench/bench_estimate.py
	$(PY) bench/bench_store.py
	$(PY) bench/bench_hooks.py

lint: install
	$(PY) -m ruff check prescreen hooks tests bench examples

clean:
	rm -rf .prescreen-demo build *.egg-info .pytest_cache
