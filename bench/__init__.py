"""Benchmarks: commands that print figures (``make bench``, ``bench-decision``, ``bench-stream``,
``bench-broker``); not shipped in the package."""
