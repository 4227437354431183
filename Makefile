# One virtual environment at .venv; every target installs first if needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install test demo bench clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

test: install
	$(PY) -m pytest -q tests

demo: install
	$(PY) -m scripts.demo

bench: install
	$(PY) scripts/bench_attention.py

clean:
	rm -rf $(VENV) runs .pytest_cache
