"""The scheduler service: the pure policy core (``agents.policy``), the routing service that
drives it from wire events, the stream handlers and the ports the worker's wiring fills."""
