# The README's two commands: `make book` and `make test`.  Everything else is a helper.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help setup book test unit notebooks data cache clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' Makefile | sed 's/:.*## /\t/'

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)  ## create the virtual environment and install the lab

book: $(STAMP)  ## build the HTML book into _build/html, warnings as errors
	$(VENV)/bin/jupyter-book build . --warningiserror --nitpick --keep-going --quiet

unit: $(STAMP)  ## unit tests only
	$(PY) -m pytest -q tests

notebooks: $(STAMP)  ## re-execute every chapter and compare with its stored outputs (nbval)
	$(PY) -m pytest -q --nbval --nbval-current-env notebooks

test: $(STAMP)  ## unit tests, nbval over every notebook, and a book build
	$(PY) -m pytest -q tests
	$(PY) -m pytest -q --nbval --nbval-current-env notebooks
	$(MAKE) book

data: $(STAMP)  ## regenerate StockArithmetic-v1 from its seed
	$(PY) -m labkit data

clean:  ## remove the built book
	rm -rf _build
