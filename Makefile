# One virtual environment at .venv; every target installs first if needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install lint test demo bench clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: install lint
	$(PY) -m pytest -q tests

demo: install
	$(PY) -m scripts.demo

bench: install
	$(PY) -m scripts.bench_attention

clean:
	rm -rf $(VENV) runs .pytest_cache
