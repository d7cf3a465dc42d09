# `make run` and `make test` set everything up from nothing: a virtualenv from the pinned
# requirements, the database, the demo team. See README.md.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000
PYTEST_ARGS ?=
CHECK_DB ?= /tmp/grundlag-check-$(shell id -u).sqlite3

.PHONY: run dev test check lint docs format lock upgrade _lock venv runtime node clean bench bench-check screenshots scaled

# What the server needs (make run), then what the tests, linters and docs need on top.
$(BIN)/.runtime: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	touch $@

$(BIN)/.installed: $(BIN)/.runtime requirements-dev.txt
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

runtime: $(BIN)/.runtime
venv: $(BIN)/.installed

# The official TypeScript MCP SDK and Standard Webhooks library the tests judge /mcp/ and the
# webhooks with, pinned by tests/node/package-lock.json (node and npm from the system).
NODE_MODULES := tests/node/node_modules/.package-lock.json
$(NODE_MODULES): tests/node/package-lock.json
	npm ci --prefix tests/node --no-audit --no-fund --loglevel=error

# The TypeScript client (clients/typescript), built with its pinned tsc for its tests.
TS_CLIENT := clients/typescript/dist/index.js
$(TS_CLIENT): clients/typescript/package-lock.json clients/typescript/tsconfig.json clients/typescript/src/index.ts
	npm ci --prefix clients/typescript --no-audit --no-fund --loglevel=error
	npm run build --prefix clients/typescript --silent

node: $(NODE_MODULES) $(TS_CLIENT)

# DEBUG stays off (the default): an error page shows nothing of the settings. Cookies are not
# marked Secure because this serves plain HTTP on 127.0.0.1; behind HTTPS they are
# (docs/how-to/deploy.md).
# Scripts run under bubblewrap, the system's (Debian's bubblewrap package); the server says at
# start when it cannot use it.
run: runtime
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py collectstatic --noinput -v0
	PORT=$(PORT) $(BIN)/python manage.py seed_demo
	PORT=$(PORT) SECURE_COOKIES=false exec $(BIN)/python manage.py serve --port $(PORT)

# The same with Django's debug pages, for development only.
dev: runtime
	$(BIN)/python manage.py migrate --noinput -v0
	PORT=$(PORT) $(BIN)/python manage.py seed_demo
	PORT=$(PORT) DEBUG=true exec $(BIN)/python manage.py serve --port $(PORT)

# The whole suite, on SQLite and PostgreSQL (GRUNDLAG_TEST_DATABASES=sqlite for one), in two
# processes (pytest-xdist; a process that runs out of tests takes some of the other's, so a long
# browser test at the end does not leave one core idle); the docs site is built strictly. The 25
# slowest tests are listed at the end: CI's fresh-clone run must stay under ten minutes.
test: venv node lint docs
	$(BIN)/pytest -n 2 --dist worksteal --durations=25 $(PYTEST_ARGS)

# The inner loop, under a minute: lint, types, and the tests that start no process, with the
# worker steps on SQLite (its test databases kept between runs: migrations are applied anew).
check: venv lint
	GRUNDLAG_TEST_DATABASES=sqlite GRUNDLAG_TEST_STEPS=worker TEST_SQLITE_NAME=$(CHECK_DB) \
	  $(BIN)/pytest -n 2 -q --reuse-db -m "not integration and not browser and not slow" $(PYTEST_ARGS)

# The docs site (mkdocs.yml, docs/), built with every warning an error.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d /tmp/grundlag-site

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Pin requirements*.txt from requirements*.in in a scratch virtualenv: what is pinned already
# stays as it is (a new dependency resolves within the pins); `make upgrade` re-resolves it all.
lock: LOCK_PINS = -c /tmp/grundlag-lock-pins.txt
lock: _lock
upgrade: LOCK_PINS =
upgrade: _lock

_lock:
	rm -rf /tmp/grundlag-lock && $(PYTHON) -m venv /tmp/grundlag-lock
	grep -hv '^-r' requirements.txt requirements-dev.txt > /tmp/grundlag-lock-pins.txt
	/tmp/grundlag-lock/bin/pip install --quiet -r requirements.in $(LOCK_PINS)
	/tmp/grundlag-lock/bin/pip freeze --exclude pip > requirements.txt
	/tmp/grundlag-lock/bin/pip install --quiet -r requirements-dev.in $(LOCK_PINS)
	(echo "-r requirements.txt"; /tmp/grundlag-lock/bin/pip freeze --exclude pip | grep -vxF -f requirements.txt) > requirements-dev.txt

clean:
	rm -rf $(VENV) tests/node/node_modules clients/typescript/node_modules clients/typescript/dist .pytest_cache .mypy_cache .ruff_cache staticfiles test.sqlite3* /tmp/grundlag-site $(CHECK_DB)_*

# The scaled topology locally: PostgreSQL + Redis (Debian packages), 2 daphne, 2 workers, beat.
scaled: venv
	deploy/local-scaled.sh

# Refresh the README's screenshots (docs/inbox.png, docs/decision.png) from the browser test.
screenshots: venv
	GRUNDLAG_SCREENSHOTS=docs $(BIN)/pytest tests/integration/browser -k "live_and_one_decision or agent_inbox_call or people_decide_in_the_browser" -q

# The engine's figures beside bench/baseline.json, failing on one more than 20 % worse (a few
# minutes). Run it before resolving a change to the engine, the models or the notifications;
# `$(BIN)/python -m bench.check --update` writes a new baseline.
bench-check: venv
	$(BIN)/pip install --quiet -r bench/requirements.txt
	$(BIN)/python -m bench.check

# The benchmarks (bench/RESULTS.md has the last results). Each is bounded to a few minutes.
bench: venv
	$(BIN)/pip install --quiet -r bench/requirements.txt
	$(BIN)/python -m bench.engine_throughput
	$(BIN)/python -m bench.push_latency
	$(BIN)/python -m bench.decision_throughput
	$(BIN)/python -m bench.inbox_scale
	$(BIN)/python -m bench.api_latency
	$(BIN)/python -m bench.row_visible
	$(BIN)/python -m bench.recovery
	$(BIN)/python -m bench.rules
