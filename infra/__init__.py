"""The adapters the deployables share: the settings object, the one bootstrap, metrics, and the
edges to the outside (``kafka/``, ``clickhouse/``, ``vllm/``). The deployables themselves live in
``worker/``, ``dispatcher/`` and ``gateway/``; the command line in ``cli/``."""
