"""The dispatcher: the engine side (``tokenfleet fleet``).

It executes the worker's routing decisions on engines and publishes what the engines did:
heartbeats, first tokens, completions, KV-cache events. ``service.py`` is the process;
``engines/`` the engine port and its two implementations, the emulated fleet (the simulator's
engine model in real time) and real vLLM servers.
"""
