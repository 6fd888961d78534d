"""The lab: whole stacks on one machine for the demos (``python -m lab.demo_cli``), the
benchmarks, the fault scenarios and the integration tests (broker, workers, dispatcher,
publisher, collector). It builds on the product (the deployables, ``local`` for stacks as
``tokenfleet up`` runs them, its vLLM launcher and tiny model, ``traffic`` for load). Product
code never imports it and the wheel does not ship it (``tests/unit/test_layers.py``,
``tests/unit/test_packaging.py``).
"""
