"""The engine model: profiles (step-time laws), one instance's continuous batching, its prefix KV
cache, fleet specs."""
