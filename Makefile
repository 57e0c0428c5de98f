# cosched: `make demo` shows it working, `make test` runs every test.
# Both set up everything they need on a fresh Debian 12 host (as root).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := qemu-system-x86 libvirt-daemon-system libvirt-clients libvirt-dev \
                pkg-config gcc libc6-dev python3-venv python3-dev systemd systemd-container debootstrap \
                clang libbpf-dev sysbench pigz
# for the deploy tests (promtool, a Prometheus server); without its recommended exporters
APT_PACKAGES_LEAN := prometheus
# what `make install` needs on a production host: no compiler, no QEMU, no Prometheus.
# libvirt's Python binding comes from Debian (python3-libvirt), seen through a
# --system-site-packages virtualenv, so nothing is compiled; so is its
# Prometheus client (0.16 on Debian 12). Nothing comes from PyPI.
RUNTIME_PACKAGES := python3 python3-venv python3-libvirt python3-prometheus-client libbpf1
INSTALL_PYTHON ?= /usr/bin/python3

# `make install` destinations (each can be overridden, e.g. for a staged install)
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SHAREDIR ?= $(PREFIX)/share/cosched
DOCDIR ?= $(PREFIX)/share/doc/cosched
MANDIR ?= $(PREFIX)/share/man
COMPLETIONDIR ?= $(PREFIX)/share/bash-completion/completions
LIBDIR ?= /opt/cosched
SYSCONFDIR ?= /etc/cosched
UNITDIR ?= /etc/systemd/system

.PHONY: deps runtime-deps venv meter image services test unit kernel integration soak demo bench bench-smoke bench-scale bench-cost install uninstall clean deb rules

missing = $$(for p in $(1); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done)

deps:
	@missing=$(call missing,$(APT_PACKAGES)); lean=$(call missing,$(APT_PACKAGES_LEAN)); \
	if [ -n "$$missing$$lean" ]; then \
	    echo "installing:" $$missing $$lean; \
	    apt-get update -q && \
	    { [ -z "$$missing" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; } && \
	    { [ -z "$$lean" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$lean; }; \
	fi

runtime-deps:
	@missing=$(call missing,$(RUNTIME_PACKAGES)); \
	if [ -n "$$missing" ]; then \
	    echo "installing:" $$missing; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

$(VENV)/.installed: setup.cfg pyproject.toml | deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# the in-kernel meter (cosched/sampler/meter.bpf.c): BPF CO-RE, so it is built
# once and loads on any kernel with BTF; without it the sampler measures
METER := cosched/sampler/meter.bpf.o
$(METER): cosched/sampler/meter.bpf.c | deps
	clang -O2 -g -Wall -target bpf -I/usr/include/$$(gcc -dumpmachine) -c $< -o $@

meter: $(METER)

image: deps venv
	$(PY) -m testbed.image || { apt-get update -q && $(PY) -m testbed.image; }

services: deps venv
	$(PY) -m testbed.services

# tests/unit: fake hosts, no root needed; tests/kernel: root, the real kernel, no guests;
# tests/integration: root, libvirtd and real guests
unit: venv meter
	$(PY) -m pytest -q tests/unit

kernel: venv meter
	$(PY) -m pytest -q tests/kernel

integration: image services meter
	$(PY) -m pytest -q tests/integration

test: image services meter
	$(PY) -m pytest -q tests

# the long form of the fault suite (python -m benchmarks.soak): 10,000 fuzzed configs,
# presets, annotations and domain XML documents each, kernel errors in every actuator,
# 100 SIGKILLs of the daemon or its switcher at random points of a rotation, 50 real and
# 1,000 synthetic guests created and destroyed next to a rotation; a table of figures
soak: image services meter
	$(PY) -m benchmarks.soak

demo: image services meter
	$(PY) -m testbed.demo

# the full benchmark suite (about two and three quarter hours on 2 CPUs, longer on a busy host); results in benchmarks/results/, written after every run
bench: image services meter
	$(PY) -m benchmarks.suite --guests 2,4 --reps 2 --seconds 5 \
	    --mixed x3,x4,busy-x3,busy-x4,busy2-x3,software-x3,software-x4,software-busy2-x3 --mixed-reps 3 --phases 90 --steady 60

# costs against the number of vCPUs and guests (synthetic guests, and 100 real ones): about 25 minutes on the 2-CPU development host
bench-scale: image services meter
	$(PY) -m benchmarks.scale

# what the default path costs (daemon, switcher, meter) at 4 real guests under cfs, gang and auto,
# against BASELINE in the same run: about 12 minutes on the 2-CPU development host
BASELINE ?= 3e6e500
bench-cost: image services meter
	$(PY) -m benchmarks.cost --baseline $(BASELINE)

# a small run of the same harness: about 2 minutes (1.7 min on the 2-CPU development host, image and services ready)
bench-smoke: image services meter
	$(PY) -m benchmarks.suite --guests 3 --workloads barrier,blocking --modes batch,cfs,gang --reps 1 --seconds 4

# The alert rules link each alert to the daemon's own runbook page
# (http://INSTANCE/runbook#alert); RUNBOOK_URL=https://... links them to a
# copy of docs/runbook.md the operator hosts instead (make install, make deb).
RUNBOOK_URL ?=
rules:
	test -n "$(RULES_DIR)" || { echo "usage: make rules RULES_DIR=DIR [RUNBOOK_URL=https://...]"; exit 2; }
	mkdir -p $(RULES_DIR)
	for f in deploy/prometheus/*.yml; do \
	    $(if $(RUNBOOK_URL),sed -e 's|{{ with $$labels.instance }}http://{{ . }}/runbook{{ end }}|$(RUNBOOK_URL)|' \
	        -e 's|http://{{ $$labels.instance }}/runbook|$(RUNBOOK_URL)|',cat) $$f > $(RULES_DIR)/$$(basename $$f); done

# The package in its own virtualenv ($(LIBDIR)), the command, the systemd unit,
# the configuration example (never over an existing one), dashboards, alert rules.
install: runtime-deps
	@test -e $(METER) || echo "note: $(METER) is not built (make meter, on a host with clang): cosched will sample /proc instead"
	$(INSTALL_PYTHON) -m venv --system-site-packages $(LIBDIR)
	$(LIBDIR)/bin/pip install -q --upgrade pip
	$(LIBDIR)/bin/pip install -q .
	install -d $(BINDIR) $(UNITDIR) $(SYSCONFDIR)/policies.d $(DOCDIR)/examples \
	    $(SHAREDIR)/grafana/dashboards $(SHAREDIR)/grafana/provisioning/dashboards \
	    $(SHAREDIR)/grafana/provisioning/datasources $(SHAREDIR)/prometheus
	ln -sfn $(LIBDIR)/bin/cosched $(BINDIR)/cosched
	test -e $(SYSCONFDIR)/cosched.toml || install -m 0644 deploy/cosched.toml $(SYSCONFDIR)/cosched.toml
	sed -e 's#/usr/local/bin/cosched#$(BINDIR)/cosched#g' -e 's#/etc/cosched/#$(SYSCONFDIR)/#g' \
	    -e 's#/usr/local/share/doc/cosched#$(DOCDIR)#g' deploy/systemd/cosched.service > $(UNITDIR)/cosched.service
	install -m 0644 deploy/grafana/dashboards/*.json $(SHAREDIR)/grafana/dashboards/
	sed -e 's#/usr/local/share/cosched#$(SHAREDIR)#g' deploy/grafana/provisioning/dashboards/cosched.yaml \
	    > $(SHAREDIR)/grafana/provisioning/dashboards/cosched.yaml
	install -m 0644 deploy/grafana/provisioning/datasources/*.yaml $(SHAREDIR)/grafana/provisioning/datasources/
	$(MAKE) -s rules RULES_DIR=$(SHAREDIR)/prometheus
	install -m 0644 README.md CHANGELOG.md $(DOCDIR)/
	cp -r docs $(DOCDIR)/ && chmod -R u=rwX,go=rX $(DOCDIR)/docs
	install -m 0644 vm-templates/examples/* $(DOCDIR)/examples/
	install -D -m 0644 docs/cosched.8 $(MANDIR)/man8/cosched.8
	install -D -m 0644 deploy/bash-completion/cosched $(COMPLETIONDIR)/cosched
	if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "installed; next: edit $(SYSCONFDIR)/cosched.toml, then systemctl enable --now cosched"

# The Debian package, dist/cosched_<version>_amd64.deb, built with Debian's own
# tools from a copy of this tree (the meter is compiled inside the build).
DEB_PACKAGES := debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools lintian clang libbpf-dev
deb:
	@missing=$(call missing,$(DEB_PACKAGES)); \
	if [ -n "$$missing" ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; fi
	rm -rf build/deb && mkdir -p build/deb/cosched dist
	tar -c --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
	    --exclude='*.bpf.o' --exclude=__pycache__ --exclude='*.egg-info' . | tar -x -C build/deb/cosched
	$(MAKE) -s rules RULES_DIR=build/deb/cosched/deploy/prometheus
	cd build/deb/cosched && env PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc -b   # Debian's Python, not any other on PATH
	mv build/deb/cosched_*.deb dist/
	lintian --fail-on error dist/cosched_*.deb

# Removes what install put in place; keeps a configuration the operator changed.
uninstall:
	if [ -d /run/systemd/system ]; then systemctl disable --now cosched.service || true; fi
	rm -f $(UNITDIR)/cosched.service $(BINDIR)/cosched
	rm -rf $(LIBDIR) $(SHAREDIR) $(DOCDIR) $(MANDIR)/man8/cosched.8 $(COMPLETIONDIR)/cosched
	if cmp -s deploy/cosched.toml $(SYSCONFDIR)/cosched.toml; then rm -f $(SYSCONFDIR)/cosched.toml; fi
	rmdir $(SYSCONFDIR)/policies.d $(SYSCONFDIR) 2>/dev/null || echo "kept $(SYSCONFDIR): it holds your configuration"
	if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

clean:
	rm -rf $(VENV) build *.egg-info
