# callgate: the two set-up commands on a fresh machine are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test test-fast lint demo bench bench-quick chaos chaos-quick chaos-stress up down clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## The main job: callgate serve on the embedded backend with the default profile.
run: $(STAMP)
	$(BIN)/callgate serve

## The whole test suite (unit, integration against the tansu broker, end to end).
test: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q -p no:cacheprovider

test-fast: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

lint: $(STAMP)
	$(BIN)/ruff check services projections tests
	$(BIN)/ruff format --check services projections tests
	$(BIN)/mypy

demo: $(STAMP)
	$(BIN)/callgate demo

bench: $(STAMP)
	$(BIN)/callgate bench

bench-quick: $(STAMP)
	$(BIN)/callgate bench --quick

chaos: $(STAMP)
	$(BIN)/callgate chaos --proposals 2000 --kills 10

chaos-quick: $(STAMP)
	$(BIN)/callgate chaos --proposals 300 --kills 3

chaos-stress: $(STAMP)
	$(BIN)/callgate chaos --proposals 1500 --kills 40 --seed 23

## Apache Kafka (KRaft) and the callgate services (needs a Docker engine).
up:
	docker compose up -d --build

down:
	docker compose down -v

clean:
	rm -rf $(VENV) .callgate .mypy_cache .ruff_cache .pytest_cache
