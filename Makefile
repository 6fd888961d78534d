# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv and installs
# what it needs first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MOONCAKE := sim/traces/mooncake/conversation_trace.jsonl

.PHONY: install demo test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	mkdir -p out
	$(VENV)/bin/tokenfleet simulate --workload $(MOONCAKE) --fleet 8xllama3-8b-h100 \
	  --policy round-robin --policy least-tokens --policy sglang-cache-aware \
	  --policy dynamo-kv --policy llm-d-default --policy ideal --json out/demo.json

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: lint
	$(PY) -m pytest -q

bench: install
	$(PY) -m sim.bench

clean:
	rm -rf $(VENV) out
