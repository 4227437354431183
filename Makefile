# One virtual environment at .venv; every target installs first if needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# uv installs the pinned requirements in seconds where pip takes minutes (torch's CUDA wheels), compiled to bytecode
# as pip does (PYTHONDONTWRITEBYTECODE=1 machines would otherwise compile every import in every process); pip if uv fails.
UV := uv==0.13.9

.PHONY: install lint test test-fast demo bench clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip $(UV)
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -r requirements.txt || $(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Two workers (pytest-xdist); a module's tests stay on one worker, so its module fixtures are built once.
PYTEST := $(PY) -m pytest -q -n 2 --dist loadscope --durations=20

test: install lint
	$(PYTEST) tests

# The quick loop: every test that trains nothing (models, kernels, data, configs, fits, Slurm rendering).
test-fast: install
	$(PYTEST) -m "not trains" tests

demo: install
	$(PY) -m scripts.demo

bench: install
	$(PY) -m scripts.bench_attention

clean:
	rm -rf $(VENV) runs .pytest_cache
