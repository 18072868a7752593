# Gantry — every target installs what it needs first (via the .venv stamp).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gantry-installed
PACKAGES := libs/core libs/events libs/security libs/protos libs/storage libs/testing libs/supervisor libs/client libs/dataload libs/sched libs/training services/audit services/governance services/scheduler services/training_agent services/serving services/profiler services/workflows services/console
PYPROJECTS := $(addsuffix /pyproject.toml,$(PACKAGES))
PROTO_OUT := libs/protos/src

.PHONY: install browser test lint protos protos-check bench bench-quick demo up clean lock

install: $(STAMP)

$(STAMP): constraints.txt requirements-dev.txt $(PYPROJECTS) Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt setuptools wheel
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt --no-build-isolation \
		--config-settings editable_mode=compat $(addprefix -e ,$(PACKAGES)) -r requirements-dev.txt
	@touch $(STAMP)

protos: $(STAMP)
	$(PY) -m gantry.protos._generate protos $(PROTO_OUT)

protos-check: $(STAMP)
	$(PY) -m gantry.protos._generate --check protos $(PROTO_OUT)

lint: $(STAMP) protos-check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The console's browser tests drive the system Chromium (Debian's package) through Playwright.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Chromium for the console's browser tests (apt-get install chromium)"; \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || { \
			$$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q chromium >/dev/null; }; }

# Two workers, one test file each at a time (a file's fixtures stay on one worker), then the
# tests marked serial (they measure real timings) alone; PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2

test: $(STAMP) browser
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "not serial"
	$(VENV)/bin/pytest -q -m serial

bench-quick: $(STAMP)
	$(PY) bench/audit_ingest.py --quick
	$(PY) bench/governance.py --quick
	$(PY) bench/sched_packing.py --quick
	$(PY) bench/sched_throughput.py --quick
	$(PY) bench/sched_jct.py --quick
	$(PY) bench/sched_latency.py --quick
	$(PY) bench/training.py --quick
	$(PY) bench/serving.py --quick
	$(PY) bench/profiler.py --quick
	$(PY) bench/workflows.py --quick
	$(PY) bench/compliance.py --quick
	$(PY) bench/chaos.py --quick

bench: $(STAMP)
	$(PY) bench/audit_ingest.py
	$(PY) bench/governance.py
	$(PY) bench/sched_packing.py
	$(PY) bench/sched_throughput.py
	$(PY) bench/sched_jct.py
	$(PY) bench/sched_latency.py
	$(PY) bench/training.py
	$(PY) bench/serving.py
	$(PY) bench/profiler.py
	$(PY) bench/workflows.py
	$(PY) bench/compliance.py
	$(PY) bench/chaos.py

demo: $(STAMP)
	$(PY) -m gantry.client.demo

up: $(STAMP)
	$(VENV)/bin/gantry up

lock:
	rm -rf /tmp/gantry-lock && $(PYTHON) -m venv /tmp/gantry-lock
	/tmp/gantry-lock/bin/pip install -q $(addprefix ./,$(PACKAGES)) -r requirements-dev.txt
	{ head -2 constraints.txt; /tmp/gantry-lock/bin/pip freeze | grep -v '^gantry' | sed 's/+cpu//'; } > constraints.new && mv constraints.new constraints.txt

clean:
	rm -rf $(VENV) .gantry .mypy_cache .ruff_cache .pytest_cache
