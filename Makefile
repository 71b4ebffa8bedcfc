# ledgerlm: `make run` brings the stack up; `make test` runs every test against real services.
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp

.PHONY: run test test-stress venv system-deps services down status clean

run: services
	$(BIN)/ledgerlm up

# The tests start their own Kafka broker and PostgreSQL (fresh log and database each session,
# under .ledgerlm/test-stack, own ports) so they never touch a running `make run` stack.
test: system-deps venv
	$(BIN)/python -m pytest -q

# The suite with 2 CPU-bound processes beside it (not in CI): a test that flakes under load shows here.
test-stress: system-deps venv
	bash scripts/stress-test.sh 2 1

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	touch $(STAMP)

system-deps:
	bash infra/scripts/system-deps.sh

services: system-deps venv
	$(BIN)/ledgerlm infra up
	$(BIN)/ledgerlm db upgrade
	$(BIN)/ledgerlm topics ensure

down:
	$(BIN)/ledgerlm infra down

status:
	$(BIN)/ledgerlm infra status

clean: down
	rm -rf .ledgerlm
