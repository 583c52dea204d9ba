# callgate: the two set-up commands on a fresh machine are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TOOLS  := .tools
UV     := $(TOOLS)/bin/uv
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)

.PHONY: install lock upgrade run serve-http openapi screenshots fuzz-http test test-fast test-authzen test-kafka test-stop test-disk test-browser test-fuzz test-keycloak test-all kafka-fetch keycloak-fetch lint demo example-agents bench bench-quick chaos chaos-quick chaos-stress chaos-instances chaos-cluster chaos-network soak toxiproxy-fetch disk-full kafka kafka-stop kafka-clean fuzz fuzz-proposals fuzz-atheris fuzz-campaign up down clean oidc-provider conformance

$(UV): requirements/uv.txt
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --require-hashes -r requirements/uv.txt
	touch $(UV)

## Installs exactly the locked versions (uv.lock, hashes checked) into .venv.
$(STAMP): $(UV) pyproject.toml uv.lock
	$(UV) sync --locked --extra dev --python $(PYTHON) --compile-bytecode
	touch $(STAMP)

install: $(STAMP)

## The OpenID Connect provider the console's sign-in tests start (oidc-provider from npm,
## the version pinned in tests/oidc/package-lock.json).
oidc-provider:
	cd tests/oidc && npm ci --no-audit --no-fund

## The official MCP conformance suite (@modelcontextprotocol/conformance, pinned in
## tests/conformance/package-lock.json, run under Node 22 from npm): the 2025-11-25 and
## 2026-07-28 server requirement sets against an upstream fixture alone, then through
## `callgate mcp --http` with a policy that allows everything; prints both pass counts.
CONFORMANCE_DEPS := tests/conformance/node_modules/.package-lock.json
$(CONFORMANCE_DEPS): tests/conformance/package-lock.json
	cd tests/conformance && npm ci --no-audit --no-fund

conformance: $(STAMP) $(CONFORMANCE_DEPS)
	$(PY) -P tests/conformance/run.py

## Re-resolves the lock after a change of pyproject.toml (keeps pinned versions where it can).
lock: $(UV)
	$(UV) lock --python $(PYTHON)

## Moves every dependency to its newest allowed version.
upgrade: $(UV)
	$(UV) lock --upgrade --python $(PYTHON)

## The runtime alone, for `make run`: the locked runtime dependencies, no development tool
## (no pytest, mypy, Playwright, Schemathesis, atheris), in an environment of its own.
RUN_VENV  := .venv-run
RUN_STAMP := $(RUN_VENV)/.installed
$(RUN_STAMP): $(UV) pyproject.toml uv.lock
	UV_PROJECT_ENVIRONMENT=$(RUN_VENV) $(UV) sync --locked --python $(PYTHON) --compile-bytecode
	touch $(RUN_STAMP)

## The main job: callgate serve on the embedded backend with the default profile, in
## development mode (development session tokens are trusted; it says so on start); state in
## ./.callgate, which every callgate command run below this directory then finds.
run: $(RUN_STAMP)
	mkdir -p .callgate
	$(RUN_VENV)/bin/callgate --dev serve

## The service with the HTTP API and the approval console on http://127.0.0.1:8787/.
serve-http: $(STAMP)
	$(BIN)/callgate serve --http

## Regenerates the checked-in OpenAPI document of the HTTP API (a test compares them).
openapi: $(STAMP)
	$(PY) -m callgate.surfaces.http.openapi > docs/openapi.json

## Refreshes the console screenshots in docs/ (the browser tests take them).
screenshots: $(STAMP)
	CALLGATE_SCREENSHOT_DIR=docs PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q -p no:cacheprovider tests/http/test_console_browser.py

## A longer Schemathesis run of the HTTP API against a live server (the suite runs 6 examples).
fuzz-http: $(STAMP)
	CALLGATE_FUZZ_EXAMPLES=200 PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q -p no:cacheprovider tests/http/test_openapi.py

## Test tiers (ADR 0024): pytest markers decide which target runs a test. `make test` is what
## a developer runs before a commit: unit, integration and end-to-end tests that need no
## Kafka, no browser and no fuzzing; two xdist workers.
PYTEST := PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q -p no:cacheprovider --durations=10
XDIST  ?= -n 2
test: $(STAMP) $(CONFORMANCE_DEPS)
	$(PYTEST) $(XDIST) -m "not kafka and not browser and not fuzz and not stop and not keycloak and not disk"

## The AuthZEN interop decision set against `callgate serve --http` (ADR 0083); also in `make test`.
test-authzen: $(STAMP)
	$(PYTEST) tests/http/test_authzen.py

## Every Kafka test, on Apache Kafka from Maven (one broker per xdist worker); fails, not
## skips, where the broker cannot start (`make kafka-fetch` fetches its jars). The network
## test needs Toxiproxy (`make toxiproxy-fetch`); CI requires it (CALLGATE_REQUIRE_TOXIPROXY).
test-kafka: $(STAMP)
	CALLGATE_REQUIRE_APACHE_KAFKA=1 $(PYTEST) $(XDIST) -m "kafka and not stop"

## SIGTERM and SIGINT at random moments stop serve (embedded and on Apache Kafka), serve
## --http and callgate mcp within their grace period, CALLGATE_STOPS times each (200 by
## default; CALLGATE_KAFKA_STOPS on Kafka, 40): none may hang.
test-stop: $(STAMP)
	CALLGATE_REQUIRE_APACHE_KAFKA=1 $(PYTEST) $(XDIST) -m stop

## A full disk under a running serve (ADR 0084): the short form of `make disk-full`, 300
## proposals and the disk full once, on a tmpfs in a mount namespace of its own (root, or
## unprivileged user namespaces; skipped with the reason elsewhere). About 30 s.
test-disk: $(STAMP)
	$(PYTEST) -m disk tests/integration/test_disk_full.py

## The approval console driven by Chromium (Playwright; Debian's /usr/bin/chromium).
test-browser: $(STAMP)
	$(PYTEST) -m browser

## Schemathesis against a live server, the atheris targets and the short fuzz campaign.
test-fuzz: $(STAMP)
	$(PYTEST) -m "fuzz and not kafka"

## A real authorization server (ADR 0082): Keycloak from Maven Central on loopback, one per
## run; its realm roles through the keycloak preset, the issuer binding, a key rotation and
## token exchange to upstreams. Fails, not skips, where Keycloak cannot start.
test-keycloak: $(STAMP)
	CALLGATE_REQUIRE_KEYCLOAK=1 $(PYTEST) -m keycloak

## Every tier, one after the other.
test-all: test test-kafka test-stop test-disk test-browser test-fuzz test-keycloak

## Fetches the Apache Kafka broker's jars (Maven) into the cache once.
kafka-fetch: $(STAMP)
	$(PY) -m tools.apache_kafka fetch

## Builds the Toxiproxy server (the network tier's fault proxy, ADR 0088) from the Go module
## proxy into the cache once (needs Go: `go` on PATH or /usr/local/go).
toxiproxy-fetch: $(STAMP)
	$(PY) -m tools.toxiproxy fetch

## Fetches Keycloak's distribution (Maven) into the cache and builds it once.
keycloak-fetch: $(STAMP)
	$(PY) -m tools.keycloak fetch

## A local Apache Kafka for development, no Docker (docs/how-to/run-on-kafka.md): the
## Maven-fetched broker on 127.0.0.1:9092, in the background, its data kept in
## .callgate/kafka; `make kafka-stop` stops it (no process left; the data stays until
## `make kafka-clean`).
KAFKA_DIR  ?= .callgate/kafka
KAFKA_PORT ?= 9092
kafka: $(STAMP)
	$(PY) -m tools.apache_kafka start --port $(KAFKA_PORT) --data-dir $(KAFKA_DIR)

kafka-stop: $(STAMP)
	$(PY) -m tools.apache_kafka stop --data-dir $(KAFKA_DIR)

kafka-clean: kafka-stop
	rm -rf $(KAFKA_DIR)

test-fast: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

lint: $(STAMP)
	$(BIN)/ruff check services projections tests tools examples
	$(BIN)/ruff format --check services projections tests tools examples
	$(BIN)/mypy
	$(BIN)/mypy examples

demo: $(STAMP)
	$(BIN)/callgate --dev demo

## The OpenAI Agents SDK agent using callgate mcp, with a scripted model (offline).
example-agents: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python examples/openai_agents_mcp.py

## Developer tools (tools/, not in the installed package: ADR 0025). Each starts the
## Apache Kafka broker it needs; `python -m tools --help` lists their options.
TOOL := PATH="$(abspath $(BIN)):$$PATH" $(PY) -m tools
bench: $(STAMP)
	$(TOOL) bench

bench-quick: $(STAMP)
	$(TOOL) bench --quick

chaos: $(STAMP)
	$(TOOL) chaos --proposals 2000 --kills 10 --broker-kills 2

chaos-quick: $(STAMP)
	$(TOOL) chaos --proposals 300 --kills 3

chaos-stress: $(STAMP)
	$(TOOL) chaos --proposals 1500 --kills 40 --seed 23

## Two instances, whole instances SIGKILLed (ADR 0015), and the broker twice.
chaos-instances: $(STAMP)
	$(TOOL) chaos --instances 2 --proposals 2000 --kills 10 --broker-kills 2

## Three Apache Kafka nodes, two instances: the busiest leader, the active controller and a
## node for a minute SIGKILLed in turn while the flows go on (the cluster tier's full form).
chaos-cluster: $(STAMP)
	$(TOOL) chaos --cluster 3 --instances 2 --proposals 2000 --kills 6 --broker-kills 3

## The network campaign (ADR 0088): two instances behind Toxiproxy, to the broker and to an
## HTTP upstream; the broker unreachable at start, then latency 200±100 ms, a bandwidth limit,
## a 30 s blackhole and connection resets on each; prints each fault's cost and the verdict.
chaos-network: $(STAMP)
	$(TOOL) chaos --network --instances 2 --hold 30 --blackhole 30 --gap 10

## The soak (docs/explanation/soak.md): two instances on Apache Kafka at 50 calls/s for
## SOAK_S seconds, sampled every SOAK_EVERY seconds; the curves as a table and a CSV.
SOAK_S ?= 1800
SOAK_RATE ?= 50
SOAK_EVERY ?= 20
SOAK_CSV ?= soak.csv
soak: $(STAMP)
	$(TOOL) soak --seconds $(SOAK_S) --rate $(SOAK_RATE) --every $(SOAK_EVERY) --csv $(SOAK_CSV)

## The full-disk campaign (ADR 0084): 2,000 proposals on the embedded backend, the disk under
## serve's state directory full three times for 10 s (a tmpfs of its own, filled by a
## ballast file); prints the verdict and what each fault cost.
disk-full: $(STAMP)
	$(TOOL) disk-full --proposals 2000 --faults 3 --hold 10

## The long fuzzing campaign (bounded: 9 minutes embedded, 1 minute on Apache Kafka);
## prints inputs tried, stalls, unauthorized effects, overwrites and the codes seen.
FUZZ_SECONDS ?= 540
FUZZ_KAFKA_SECONDS ?= 60
fuzz: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(PY) -m tests.fuzz.run --seconds $(FUZZ_SECONDS) --kafka-seconds $(FUZZ_KAFKA_SECONDS)

## The same campaign to 10^5 proposals on the embedded backend (FUZZ_PROPOSALS), bounded by
## FUZZ_PROPOSALS_SECONDS (25 minutes: 10^5 took 13.6 minutes on a shared 2-core machine,
## and did not fit in 15 under load);
## prints the same figures, the proposals made each minute and proposals per second.
FUZZ_PROPOSALS ?= 100000
FUZZ_PROPOSALS_SECONDS ?= 1500
fuzz-proposals: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" nice -n 19 $(PY) -m tests.fuzz.run --proposals $(FUZZ_PROPOSALS) --seconds $(FUZZ_PROPOSALS_SECONDS)

## Coverage-guided fuzzing (atheris) of every decoder at an entry (docs/explanation/fuzzing.md):
## Avro records, tokens, arguments, the strict JSON reader, MCP JSON-RPC messages and
## requestState, form bodies (Slack, sign-in callback), callgate.toml and profiles. Each
## target runs to FUZZ_RUNS inputs or FUZZ_TARGET_SECONDS, one after the other, from its
## corpus in .fuzz-corpus/<target> (kept between runs, seeded when empty); findings go to
## .fuzz-findings/. Prints inputs, coverage, corpus and findings per target; fails on a finding.
## FUZZ_TARGETS="json mcp" runs only those.
FUZZ_RUNS ?= 1000000
FUZZ_TARGET_SECONDS ?= 600
FUZZ_TARGETS ?=
fuzz-campaign: $(STAMP)
	nice -n 19 $(PY) -m tests.fuzz.campaign --runs $(FUZZ_RUNS) --seconds $(FUZZ_TARGET_SECONDS) $(FUZZ_TARGETS)

## The short form: 60 s (ATHERIS_SECONDS) per target, the same kept corpus.
ATHERIS_SECONDS ?= 60
fuzz-atheris: $(STAMP)
	$(PY) -m tests.fuzz.campaign --runs $(FUZZ_RUNS) --seconds $(ATHERIS_SECONDS)

## Apache Kafka (KRaft) and the callgate services (needs a Docker engine).
up:
	docker compose up -d --build

down:
	docker compose down -v

clean:
	rm -rf $(VENV) $(RUN_VENV) $(TOOLS) .callgate .mypy_cache .ruff_cache .pytest_cache .fuzz-findings

## `callgate policy simulate` throughput on a recorded history of 100,000 proposals
## (recorded once into ~/.cache/callgate/bench-simulate; prints one row).
.PHONY: bench-simulate
bench-simulate: $(STAMP)
	$(PY) -m tools.bench_simulate --proposals 100000

## What tracing costs: the same calls with [tracing] off and on, in one run (ADR 0036).
.PHONY: bench-tracing
bench-tracing: $(STAMP)
	$(TOOL) bench --only tracing

## The agent's path: the same MCP tool call direct and through `callgate mcp --http`
## (official SDK client, A/B alternated), sequential and 20 concurrent agents.
.PHONY: bench-agent
bench-agent: $(STAMP)
	$(PY) -m tools.bench_agent

## CI's regression guard on the agent's path (ADR 0076): 150 sequential calls direct and
## through `callgate mcp --http`, A/B, embedded backend; fails when the ratio of the two
## medians (through / direct) exceeds its bound. A ratio, not a time: a busy machine slows
## both paths.
.PHONY: bench-guard
bench-guard: $(STAMP)
	$(PY) -m tools.bench_guard

## The bench's figures of BEFORE (a revision or a checkout) and of this checkout, in one
## run: sections alternated ABBA over BENCH_ROUNDS rounds, each measure's medians compared;
## fails when one is worse by more than 5%. A refactor shows here that it costs no speed.
BEFORE ?= origin/main
BENCH_ROUNDS ?= 5
.PHONY: bench-compare
bench-compare: $(STAMP)
	$(PY) -m tools.bench_compare --before $(BEFORE) --rounds $(BENCH_ROUNDS)

## Time from `callgate freeze` / `unfreeze` to enforcement on a running `callgate serve`
## (embedded store, and every partition of two instances on Apache Kafka; rows from the
## event and from the command's start).
.PHONY: bench-freeze
bench-freeze: $(STAMP)
	$(PY) -m tools.bench_freeze --rounds 5
