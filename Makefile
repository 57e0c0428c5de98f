# cosched: `make demo` shows it working, `make test` runs every test.
# Both set up everything they need on a fresh Debian 12 host (as root).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := qemu-system-x86 libvirt-daemon-system libvirt-clients libvirt-dev \
                pkg-config gcc libc6-dev python3-venv python3-dev

.PHONY: deps venv image services test unit integration demo bench bench-smoke clean

deps:
	@missing=$$(for p in $(APT_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	    echo "installing:" $$missing; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

$(VENV)/.installed: setup.cfg pyproject.toml | deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

image: deps venv
	$(PY) -m testbed.image || { apt-get update -q && $(PY) -m testbed.image; }

services: deps venv
	$(PY) -m testbed.services

unit: venv
	$(PY) -m pytest -q -m 'not integration' tests

integration: image services
	$(PY) -m pytest -q -m integration tests

test: image services
	$(PY) -m pytest -q tests

demo: image services
	$(PY) -m testbed.demo

# the full benchmark suite (about 30 minutes on 2 CPUs); results in benchmarks/results/
bench: image services
	$(PY) -m benchmarks.suite --guests 2,4 --reps 2 --seconds 5

# a small run of the same harness, under five minutes
bench-smoke: image services
	$(PY) -m benchmarks.suite --guests 3 --workloads barrier,blocking --modes batch,cfs,gang --reps 1 --seconds 4

clean:
	rm -rf $(VENV) build *.egg-info
