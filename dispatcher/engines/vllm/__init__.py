"""Real vLLM engines behind the engine port: the HTTP adapter, the /metrics scrape, KV events."""
