"""Entry points: the ``tokenfleet`` CLI, the worker, the fleet dispatcher, the load generator, the demo."""
