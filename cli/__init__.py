"""The ``tokenfleet`` command line: one command per job, each starting a deployable, a simulator
run, a store query or the demo."""
