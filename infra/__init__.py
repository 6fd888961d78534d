"""The adapters the deployables share: the settings object, metrics, and the edges to the
outside (``kafka/``, ``clickhouse/``, ``vllm/``). The deployables themselves live in ``worker/``
(its wiring too), ``dispatcher/`` and ``gateway/``; the command line in ``cli/``."""
