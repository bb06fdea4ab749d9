# The two commands a new user types (as root on Debian/Ubuntu):
#   make demo   provision the local testbed and run the whole loop on it
#   make test   run the whole test suite
# and, while you work (docs/testing.md):
#   make test-unit  no root, no local hosts, no sshd
#   make test-fast  the unit tests, the loopback-sshd cloud fakes and the tests on one shared local testbed (root)
# Both install what they need: the apt packages, then .venv/ with testbed and its extras.

VENV   ?= .venv
PYTHON ?= $(shell command -v python3.11 || command -v python3)
APT_PACKAGES = openssh-server openssh-client iproute2 rsync openmpi-bin libopenmpi-dev git make gcc \
               sudo zsh tcsh pssh procps psmisc curl ca-certificates cgroup-tools tmux build-essential \
               shellcheck vmtouch slurmctld slurmd slurm-client munge strace
# where the distribution packages it: the headless Chromium that opens the HTML reports in a test
APT_OPTIONAL = chromium-headless-shell
STAMP  = $(VENV)/.installed

.PHONY: demo test test-fast test-unit deps venv lint clean

deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	optional=""; for p in $(APT_OPTIONAL); do dpkg -s $$p >/dev/null 2>&1 || optional="$$optional $$p"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" != 0 ]; then echo "need root to apt-get install:$$missing" >&2; exit 1; fi; \
	if [ -n "$$missing$$optional" ] && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq; \
	  for p in $$optional; do if apt-cache show $$p >/dev/null 2>&1; then missing="$$missing $$p"; fi; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing apt packages:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  fi; \
	fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	-$(VENV)/bin/pip uninstall -q -y testbed 2>/dev/null  # this project's former distribution name
	$(VENV)/bin/pip install -q -e '.[chameleon,tpu,dev]'
	$(VENV)/bin/pip install -q 'torch==2.13.0' || $(VENV)/bin/pip install -q torch
	touch $(STAMP)

venv: deps $(STAMP)

demo: venv
	$(VENV)/bin/testbed demo

# the suite waits on hosts far more than it computes: three workers, one test file each at a time
# (each worker's shared local testbed is reset between files); the slowest 25 tests are listed at the end
test: venv
	$(VENV)/bin/python -m pytest -q -ra -n 3 --dist loadfile --durations=25

# tiers by marker, the markers applied by fixture (tests/tiers.py)
test-unit: $(STAMP)  # no root: not the apt packages
	$(VENV)/bin/python -m pytest -q -ra -n 2 -m "not local and not sshd and not slow" --durations=10

test-fast: venv
	$(VENV)/bin/python -m pytest -q -ra -n 2 --dist loadfile -m "not slow and not own_testbed" --durations=10

lint: venv
	$(VENV)/bin/ruff check testbed tests bench
	$(VENV)/bin/mypy testbed
	shellcheck testbed/scripts/*.sh
	cd playbooks && ../$(VENV)/bin/ansible-lint roles

clean:
	-$(VENV)/bin/testbed destroy local --yes
	rm -rf $(VENV) .testbed
