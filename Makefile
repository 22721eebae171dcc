# Everything a fresh machine needs is installed by these targets: the Python venv, the Docker
# engine (Debian's docker.io) and the sandbox image (built with no container registry).
PY := .venv/bin/python
VENV_STAMP := .venv/.installed
PYTEST_ARGS ?=

.PHONY: run test venv engine image base-image proto proto-check lint type unit bench clean-containers

run: venv image  ## start the platform on embedded defaults
	$(PY) -m controlplane serve

test: venv image proto-check lint type  ## every test, Docker ones included
	$(PY) -m pytest $(PYTEST_ARGS)

venv: $(VENV_STAMP)
$(VENV_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --disable-pip-version-check hatchling editables
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation -e '.[dev]'
	touch $@

engine:
	bash scripts/ensure-engine.sh

base-image: engine
	bash sandbox-image/build-base.sh

image: engine
	bash sandbox-image/build-image.sh

proto: venv
	bash scripts/gen-proto.sh

proto-check: venv
	bash scripts/gen-proto.sh --check

lint: venv
	$(PY) -m ruff check .

type: venv
	$(PY) -m mypy controlplane sandbox-image/sandbox_agent tests

unit: venv  ## the tests that need no Docker engine
	$(PY) -m pytest -m 'not docker' $(PYTEST_ARGS)

bench: venv image
	$(PY) tests/bench/bench.py

clean-containers:  ## remove every container and volume any local control plane left behind
	docker ps -aq --filter label=ocsb.managed=true | xargs -r docker rm -f
	docker volume ls -q --filter label=ocsb.managed=true | xargs -r docker volume rm -f
