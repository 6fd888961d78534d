"""The OpenAI-compatible gateway: HTTP in, the scheduler's decision, the chosen engine, the answer out."""
