# The README's two commands: `make book` and `make test`.  Everything else is a helper.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help setup book test test-slow unit notebooks notebooks-portable data cache clean mathjax browser browser-check student student-book

help:  ## list the targets
	@awk -F ':.*## ' '/^[a-z-]+:.*## / { printf "%-20s %s\n", $$1, $$2 }' Makefile

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)  ## create the virtual environment and install the lab

# Offline maths: MathJax comes from the npm registry into _build/offline (ignored by git)
# and is copied into the book's static files, so no page loads anything from a CDN.
MATHJAX_VERSION := 3.2.2
OFFLINE := _build/offline
MATHJAX_STAMP := $(OFFLINE)/.mathjax-$(MATHJAX_VERSION)

$(MATHJAX_STAMP):
	@command -v npm >/dev/null || { echo "make book needs npm (Node.js) to fetch MathJax $(MATHJAX_VERSION) for offline maths: install Node.js, e.g. apt-get install -y npm" >&2; exit 1; }
	npm install --prefix $(OFFLINE)/npm --no-audit --no-fund --no-save --silent mathjax@$(MATHJAX_VERSION)
	rm -rf $(OFFLINE)/static/mathjax && mkdir -p $(OFFLINE)/static/mathjax
	cd $(OFFLINE)/npm/node_modules/mathjax/es5 && cp -R tex-mml-chtml.js a11y adaptors input output sre ui $(CURDIR)/$(OFFLINE)/static/mathjax/
	touch $@

mathjax: $(MATHJAX_STAMP)  ## install MathJax locally for the book (offline maths)

book: $(STAMP) $(MATHJAX_STAMP)  ## build the HTML book into _build/html, warnings as errors
	$(VENV)/bin/jupyter-book build . --warningiserror --nitpick --keep-going --quiet
	$(PY) -m labkit.book.build check-offline _build/html

# The browser check drives a headless Chromium with Playwright (its Python package bundles the
# driver).  Which Chromium: $$LABKIT_CHROMIUM if set, else Debian's /usr/bin/chromium, else the
# one Playwright manages (`playwright install chromium`, into ~/.cache/ms-playwright).
# tests/find_browser.py decides and says exactly what is missing when none can be had.
PLAYWRIGHT_VERSION := 1.65.2
PLAYWRIGHT_STAMP := $(VENV)/.playwright-$(PLAYWRIGHT_VERSION)

$(PLAYWRIGHT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet playwright==$(PLAYWRIGHT_VERSION)
	touch $@

browser: $(PLAYWRIGHT_STAMP)  ## find (or install) the headless Chromium the browser check uses
	@$(PY) tests/find_browser.py --install >/dev/null

browser-check: browser  ## open every page of the instructor and student books in headless Chromium
	$(PY) tests/browser_check.py _build/html --screenshots _build/screenshots
	$(PY) tests/browser_check.py $(STUDENT_HTML) --screenshots _build/screenshots/student
	$(PY) -m labkit.book.build check-student $(STUDENT_HTML)

# The student book: the same pages built from the student copies (solutions stubbed), so it
# holds no solution at all.  Its sources are assembled in _build/student_src.
STUDENT_SRC := _build/student_src
STUDENT_HTML := $(STUDENT_SRC)/_build/html

student-book: $(STAMP) $(MATHJAX_STAMP)  ## build the student book (no solutions) into _build/student_src/_build/html
	$(PY) -m labkit.book.build student-sources $(STUDENT_SRC)
	$(VENV)/bin/jupyter-book build $(STUDENT_SRC) --warningiserror --nitpick --keep-going --quiet
	$(PY) -m labkit.book.build check-offline $(STUDENT_HTML)

student: $(STAMP)  ## write the student copies of every chapter (solutions stubbed) into student/
	$(PY) -m labkit student --out student/

unit: $(STAMP)  ## unit tests only, on both cores
	$(PY) -m pytest -q -p no:nbval -n 2 --dist loadfile --no-loadscope-reorder tests

test-slow: $(STAMP)  ## what `make test` leaves out (CI runs it after): slow fault injection, a cluster, and nbval and the stored-value tests under portable kernels
	$(PY) tests/phases.py --slow

notebooks: $(STAMP)  ## re-execute every chapter and compare with its stored outputs (nbval)
	$(PY) -m pytest -q --nbval --nbval-current-env notebooks

# PyTorch's portable kernels round differently from the vectorised ones a CPU picks: a stored
# output that passes under both holds on other CPUs too.
notebooks-portable: $(STAMP)  ## nbval again with PyTorch's portable kernels (ATEN_CPU_CAPABILITY=default)
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q --nbval --nbval-current-env notebooks

# The phases run side by side where they are independent (tests/phases.py, which prints each phase's
# wall time, CPU time and peak memory at the end): the unit tests on both cores (pytest-xdist) beside
# both books' builds, each book then opened in headless Chromium; then nbval in two halves beside the
# qwen smoke.  What would
# hold on another CPU (nbval and the stored-value tests again under PyTorch's portable kernels) and the
# slow fault-injection tests are `make test-slow`'s, which CI runs after this.
test: $(STAMP)  ## unit tests, nbval over every chapter, both books and their browser check
	$(PY) tests/phases.py

cache: $(STAMP)  ## rebuild the stale steps of the cached tiny run, then the results page and the chapters' outputs
	$(PY) -m labkit all --preset tiny --rebuild-stale --threads 1
	$(PY) -m labkit sweep --preset tiny --workers 2
	$(PY) -m labkit sweep sweeps/chapter10.json --preset tiny --workers 2
	$(PY) -m labkit sweep sweeps/ablations.json --preset tiny --workers 2
	$(PY) -m labkit sweep sweeps/reasoning.json --preset tiny --workers 2
	$(PY) -m labkit.book.build results-page
	$(PY) -m labkit.book.build execute

data: $(STAMP)  ## regenerate StockArithmetic-v1 from its seed
	$(PY) -m labkit data

clean:  ## remove the built book
	rm -rf _build
