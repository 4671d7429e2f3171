# The two commands README.md names: `make lab` (the main job) and `make test` (every test).
# Both create .venv and install everything into it on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ppkit-installed

.PHONY: lab test setup browser lint bench clean

# JupyterLab listens on localhost only; root (containers, this kit's CI machine) needs --allow-root.
lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(LAB_ARGS)

test: $(STAMP) browser
	$(PY) -m pytest tests notebooks --nbval-lax --sanitize-with tests/nbval_sanitize.cfg $(PYTEST_ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -c constraints.txt -e '.[test]'
	touch $(STAMP)

# Debian's chromium for the browser tests (Playwright drives it; it never downloads a browser).
browser:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "chromium is missing: install it (e.g. sudo apt-get install chromium); browser tests will be skipped"; fi; }

lint: $(STAMP)
	$(VENV)/bin/ruff check ppkit tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/bench_startup.py

clean:
	rm -rf $(VENV)
