"""The lab: a whole stack on one machine for the demos, the benchmarks, the fault scenarios and
the integration tests (broker, workers, dispatcher, publisher, collector), the vLLM launcher and
the tiny model the CPU engines serve. Product code never imports it (``tests/unit/test_layers.py``).
"""
