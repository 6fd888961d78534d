"""Real vLLM engines behind the engine port: inventory, /metrics scrape, KV events, HTTP adapter."""
