"""Talking to vLLM servers over HTTP, shared by the gateway and the dispatcher: the inventory of
engines, the OpenAI-compatible client and how a call's outcome is read."""
