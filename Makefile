# Two commands do all the set-up: `make up` (run the twin) and `make test` (the suite).
# Each bootstraps .venv when it is missing or older than pyproject.toml, setup.py or the C sources it builds.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test lint bench clean venv

$(STAMP): pyproject.toml setup.py rackserve/splitmix.h rackserve/sim/_lruset.c rackserve/workload/_blockids.c rackserve/kv/_poolcore.c rackserve/timing/_pricer.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/python -c 'import services.proto_build as p; p.build()'
	touch $(STAMP)

venv: $(STAMP)

up: $(STAMP)
	$(BIN)/rackserve up $(ARGS)

test: $(STAMP)
	@command -v prometheus >/dev/null || echo "NOTE: prometheus is not on PATH, so its tests will be skipped; get it with: apt-get install -y --no-install-recommends prometheus"
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check rackserve services tests bench

clean:
	rm -rf $(VENV) .pytest_cache build rackserve/sim/*.so rackserve/workload/*.so rackserve/kv/*.so rackserve/timing/*.so
