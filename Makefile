# The commands README.md names: `make lab` (the main job), `make test` (every test, what CI runs) and
# `make test-fast` (the unit tests and one notebook, for everyday work).
# Both create .venv and install everything into it on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ppkit-installed
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.PHONY: lab lab-options test test-fast soak setup browser slurm hub lint bench clean

# JupyterLab listens on localhost only; root (containers, this kit's CI machine) needs --allow-root.
# No "Would you like to get notified about official Jupyter news?" box over the first notebook: JupyterLab asks
# whenever its fetchNews setting is unset, whatever the server's news_url, so LAB_DEFAULTS sets it (and no update
# check) for this environment's labs, in JupyterLab's overrides.d; LAB_OPTIONS keeps the server from fetching news
# or versions at all. tests/browser/test_lab_first_open.py starts a lab as `make lab` does (`make -s lab-options`)
# and fails if the box appears. docs/workshop.md gives the same file to a hub's environment.
LAB_OPTIONS := --LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate
LAB_DEFAULTS := $(VENV)/share/jupyter/lab/settings/overrides.d/ppkit-workshop.json
$(LAB_DEFAULTS): scripts/lab-settings/ppkit-workshop.json $(STAMP)
	install -D -m 644 $< $@

lab: $(STAMP) $(LAB_DEFAULTS)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 $(LAB_OPTIONS) \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(LAB_ARGS)

lab-options:
	@echo $(LAB_OPTIONS)

# Two pytest-xdist workers: the suite waits more than it computes, so two finish it sooner on 2 cores; files,
# notebooks, the browser-and-hub tests and the SLURM tests each stay on one worker (tests/scheduling.py).
# TEST_WORKERS=0 runs everything in one pytest. The run ends with a table of where the time went (tests/timing.py).
TEST_WORKERS ?= 2
# The suite runs as on a shared machine (docs/isolation.md): ranks in private networks, so that two test workers'
# ranks on one fixed port (the DDP tutorial's 12355) do not meet; tests of the one-user default set it to 0 themselves.
test test-fast: export PPKIT_SHARED_MACHINE = 1
test: $(STAMP) $(LAB_DEFAULTS) browser slurm hub
	$(PY) -m pytest -n $(TEST_WORKERS) tests notebooks --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg \
	  $(PYTEST_ARGS)

# Everything not marked slow (pyproject.toml), without the browser, hub and SLURM kinds (tests/markers.py),
# and notebook 00. Any kind can be picked the same way: make test PYTEST_ARGS='-m "cluster and not slow"'.
FAST_NOTEBOOK ?= notebooks/00_start_here.ipynb
FAST_MARKERS ?= not slow and not slurm and not browser and not hub
test-fast: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) tests $(FAST_NOTEBOOK) --nbval-lax \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# The full soak: 200 calls on 4 ranks, one in five with a rank killed (the suite runs 10 of them:
# tests/test_cluster_soak.py).
soak: $(STAMP)
	$(PY) benchmarks/bench_soak.py --calls 200

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -c constraints.txt -e '.[test,ft]'
	touch $(STAMP)

# Debian's chromium for the browser tests (Playwright drives it; it never downloads a browser).
browser:
	bash scripts/install_chromium.sh

# Debian's SLURM and munge for the SLURM tests (they start a test cluster of their own; no daemon is started here).
slurm:
	bash scripts/install_slurm.sh

# JupyterHub's proxy (configurable-http-proxy, from npm; node and npm from apt when missing) and the acl tools for
# the hub test, which makes two learner accounts and runs a hub of its own (tests/hub_testbed.py); slirp4netns, the
# way out of a shared machine's private networks (scripts/install_slirp.sh).
hub:
	bash scripts/install_hub.sh && bash scripts/install_slirp.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check ppkit tests benchmarks conftest.py

bench: $(STAMP)
	$(PY) benchmarks/bench_startup.py

clean:
	rm -rf $(VENV)
