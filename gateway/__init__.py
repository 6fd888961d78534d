"""The gateway: the OpenAI-compatible front door (``tokenfleet gateway``).

A client's call is asked of the decider that owns it, directly; that decider answers with the
engine and records the request and its decision on the log; the gateway forwards the call there
and streams the answer back (the HTTP side in ``server.py``; running a decided call on its engine
and streaming it back in ``proxy.py``; the OpenAI wire format in ``openai_api.py``; which decider
to ask, and asking it, in ``deciders.py``; who the caller is, from its API key, in ``auth.py``;
each call's id, the client's ``x-request-id`` where it can be, in ``request_ids.py``; what one
client may hold, its connections' time and number, in ``connections.py``).
"""
