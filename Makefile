# Everything a fresh machine needs is installed by these targets: the Python venv, the Docker
# engine (Debian's docker.io) and the sandbox image (built with no container registry).
PY := .venv/bin/python
VENV_STAMP := .venv/.installed
PYTEST_ARGS ?=

.PHONY: run test venv engine image base-image proto proto-check lint type unit bench attack clean-containers
.PHONY: postgres test-postgres oracle-record
.PHONY: trace-demo soak bench-scale

run: venv image  ## start the platform on embedded defaults
	$(PY) -m controlplane serve

test: venv image postgres proto-check lint type  ## every test, Docker ones included (and the cluster's where possible)
	$(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-cluster

venv: $(VENV_STAMP)
$(VENV_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --disable-pip-version-check hatchling editables setuptools wheel
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
	$(PY) -m mypy controlplane opencode_semantics sandbox-image/sandbox_agent tests

# PostgreSQL's server binaries are one apt install on a fresh machine and each test run starts its own
# throwaway server (~1.5 s), so `make test` includes the postgres tests whenever the package can be
# installed; where it cannot (no root, no apt), they skip and say why.
postgres:  ## PostgreSQL's server binaries for the store tests (Debian's postgresql), when installable
	@bash scripts/ensure-postgres.sh >/dev/null || echo "postgres: not installable here; tests marked postgres will skip"

test-postgres: venv image  ## the store contract on SQLite and a real PostgreSQL, and two control planes sharing one
	bash scripts/ensure-postgres.sh >/dev/null
	$(PY) -m pytest tests/store $(PYTEST_ARGS)

unit: venv  ## the tests that need no Docker engine
	$(PY) -m pytest -m 'not docker' $(PYTEST_ARGS)

trace-demo: venv image  ## one traced session (slow custom tool) exported to a real OTLP collector on loopback
	$(PY) -c 'import rotel' 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check 'rotel==0.0.1a15'
	$(PY) -m scripts.trace_demo

bench: venv image  ## single-host figures with their baselines, then the cluster's (bench-cluster, where possible)
	$(PY) -m tests.bench.bench $(BENCH_ARGS)
	$(MAKE) --no-print-directory bench-cluster

bench-scale: venv image  ## many sessions at once: calls at 8/32/64 sessions, a create burst, idle memory at 10/100/200, pool upkeep (bounded: 30 min; BENCH_ARGS=--quick)
	timeout 1800 $(PY) -m tests.bench.scale_bench $(BENCH_ARGS)

attack: venv image  ## the escape and resource-attack suite with more samples, then the attack bench (bounded: 15 min)
	OCSB_ATTACK_SAMPLES=40 OCSB_ATTACK_ABORTS=5 OCSB_ATTACK_ROUNDS=3 timeout 900 $(PY) -m pytest -q --timeout 600 \
		tests/security tests/docker/test_hardening_fail_closed.py
	timeout 600 $(PY) -m tests.bench.attack_bench

soak: venv image  ## fuzzing (soak profile), faults, load and 1,000 create/delete cycles (bounded: 60 min); prints figures
	OCSB_SOAK=1 timeout 3600 $(PY) -m pytest -q -s tests/fuzz tests/faults tests/load $(PYTEST_ARGS)

oracle-record: venv  ## record upstream OpenCode v1.2.27's answers to tests/oracle cases (fetches its binary with npm)
	$(PY) -m tests.oracle.record $(GROUPS)

clean-containers:  ## remove every container and volume any local control plane left behind
	docker ps -aq --filter label=ocsb.managed=true | xargs -r docker rm -f
	docker volume ls -q --filter label=ocsb.managed=true | xargs -r docker volume rm -f
	docker volume ls -q --filter name=ocsb- | grep -E '^ocsb-.+-[0-9a-f]{12}-ws$$' | xargs -r docker volume rm -f

.PHONY: cluster-up cluster-down test-cluster bench-cluster
cluster-up: engine  ## a two-node swarm on this machine (second dockerd in netns ocsb-worker); needs root
	bash scripts/cluster.sh up

cluster-down:  ## removes everything cluster-up made (and leaves a swarm it did not create)
	bash scripts/cluster.sh down

test-cluster: venv image  ## the cluster tests: up, tests, down (skipped with a reason where not possible)
	@if bash scripts/cluster.sh check; then \
	  bash scripts/cluster.sh up && { $(PY) -m pytest -m cluster tests/cluster $(PYTEST_ARGS); rc=$$?; \
	  bash scripts/cluster.sh down; exit $$rc; }; \
	else $(PY) -m pytest -m cluster tests/cluster $(PYTEST_ARGS); fi

bench-cluster: venv image  ## cluster bench section: up, section (--quick with BENCH_ARGS=--quick), down; bounded
	@if bash scripts/cluster.sh check; then \
	  was_up=$$(bash scripts/cluster.sh status | sed -n 's/^UP=//p'); \
	  timeout 300 bash scripts/cluster.sh up; rc=$$?; \
	  [ $$rc -ne 0 ] || { timeout 1500 $(PY) -m tests.bench.cluster_bench $(BENCH_ARGS); rc=$$?; }; \
	  [ "$$was_up" = 1 ] || timeout 300 bash scripts/cluster.sh down; exit $$rc; \
	else $(PY) -m tests.bench.cluster_bench $(BENCH_ARGS); fi
