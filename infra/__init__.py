"""Everything that touches the outside: the settings object, the one bootstrap, the adapters
(``kafka/``, ``clickhouse/``, ``engines/``, ``metrics``) and the entry points (``entrypoints/``)."""
