# `make run` and `make test` set everything up from nothing: a virtualenv from the pinned
# requirements, the database, the demo team. See README.md.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: run dev test lint format lock venv node clean bench screenshots scaled

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

venv: $(BIN)/.installed

# The official TypeScript MCP SDK and Standard Webhooks library the tests judge /mcp/ and the
# webhooks with, pinned by tests/node/package-lock.json (node and npm from the system).
NODE_MODULES := tests/node/node_modules/.package-lock.json
$(NODE_MODULES): tests/node/package-lock.json
	npm ci --prefix tests/node --no-audit --no-fund --loglevel=error

node: $(NODE_MODULES)

# DEBUG stays off (the default): an error page shows nothing of the settings. Cookies are not
# marked Secure because this serves plain HTTP on 127.0.0.1; behind HTTPS they are (README).
run: venv
	$(BIN)/python manage.py migrate --noinput
	PORT=$(PORT) $(BIN)/python manage.py seed_demo
	PORT=$(PORT) SECURE_COOKIES=false exec $(BIN)/python manage.py serve --port $(PORT)

# The same with Django's debug pages, for development only.
dev: venv
	$(BIN)/python manage.py migrate --noinput
	PORT=$(PORT) $(BIN)/python manage.py seed_demo
	PORT=$(PORT) DEBUG=true exec $(BIN)/python manage.py serve --port $(PORT)

test: venv node lint
	$(BIN)/pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Re-pin requirements*.txt from requirements*.in in a scratch virtualenv.
lock:
	rm -rf /tmp/grundlag-lock && $(PYTHON) -m venv /tmp/grundlag-lock
	/tmp/grundlag-lock/bin/pip install --quiet -r requirements.in
	/tmp/grundlag-lock/bin/pip freeze --exclude pip > requirements.txt
	/tmp/grundlag-lock/bin/pip install --quiet -r requirements-dev.in
	(echo "-r requirements.txt"; /tmp/grundlag-lock/bin/pip freeze --exclude pip | grep -vxF -f requirements.txt) > requirements-dev.txt

clean:
	rm -rf $(VENV) tests/node/node_modules .pytest_cache .mypy_cache .ruff_cache staticfiles test.sqlite3*

# The scaled topology locally: PostgreSQL + Redis (Debian packages), 2 daphne, 2 workers, beat.
scaled: venv
	deploy/local-scaled.sh

# Refresh the README's screenshots (docs/inbox.png, docs/decision.png) from the browser test.
screenshots: venv
	GRUNDLAG_SCREENSHOTS=docs $(BIN)/pytest tests/integration/browser -k live_and_one_decision -q

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
