"""An emulated vLLM server: one process is one inference instance of the simulator's engine model
(``sim/engine``), run in wall time, behind vLLM's HTTP API, so the gateway, the dispatcher's vLLM
engine port and the fault suite run against it as against vLLM, without vLLM.

Run one with ``python -m local.emulated_vllm --port N --profile llama3-8b-h100 --served-model-name
NAME --kv-events tcp://127.0.0.1:PORT [--kv-replay tcp://127.0.0.1:PORT] [--tokenizer DIR]
[--speed X] [--max-num-seqs N] [--load-s S]`` (``tokenfleet up --engines emulated`` starts them).
The contract:

- **Timing.** The instance is ``sim.engine.instance.Instance`` with the named profile (vLLM V1's
  scheduler: FCFS queue, chunked prefill under the token budget, prefix cache in 512-token
  blocks, recompute pre-emption) driven by ``sim.loop.live.LiveFleet``; emulated time runs
  ``--speed`` times faster than the clock. ``--max-num-seqs`` caps the calls running at once
  (the profile's ``max_seqs``; the rest wait, as vLLM's flag makes them). ``--load-s``: the
  HTTP port opens that many seconds after the start, as vLLM's opens once the weights are
  loaded (a replica's load time, for the planners). A call's first token leaves at the end of the step
  that finishes its prefill; later tokens go out as the steps generate them, those of one
  ``engine.STREAM_INTERVAL_S`` in one chunk (as vLLM's ``--stream-interval`` merges them).
- **Calls.** ``POST /v1/chat/completions`` and ``/v1/completions``, streamed (server-sent events,
  ``data: [DONE]`` last; with ``stream_options.include_usage`` a closing chunk with ``usage`` and
  no choices) or not. Bodies are read as the gateway reads a client's
  (``gateway.openai_api.parse_body``): a bad one gets OpenAI's error JSON (400; an unknown model
  404); a prompt plus ``max_tokens`` beyond the KV cache is refused as vLLM refuses one beyond
  ``max_model_len`` (400). A client that disconnects aborts its call (waiting: it leaves the
  queue; running: at the end of the step in progress), as vLLM aborts it.
- **Tokens.** A prompt is tokenized as ``infra.prompts.PromptTokenizer`` does for the gateway
  and the worker, with ``--tokenizer DIR`` (default: the tiny model of ``local.tiny_model``), so
  ``usage.prompt_tokens`` and the prompt's block hashes agree with theirs. The answer's length
  is ``answers.answer_length``: ``max_tokens`` with ``ignore_eos``, else ``max_tokens`` unless
  the prompt's own length rule ends it sooner (``finish_reason`` ``stop``); its text is
  deterministic filler (``answers.token_text``). ``usage.prompt_tokens_details.cached_tokens``
  is the prefix the cache held.
- **Metrics.** ``GET /metrics``: vLLM's series as ``dispatcher/engines/vllm/metrics.py`` reads
  them (``metrics.py`` here); ``GET /health`` 200 while serving; ``GET /v1/models`` the served
  model.
- **KV events.** vLLM's wire format on ZMQ (``kv_events.py`` here): a PUB socket bound at
  ``--kv-events`` sends one batch per engine step that changed the cache, its blocks 512 tokens
  (TokenFleet's prefix blocks: one vLLM block each), so ``dispatcher/engines/vllm`` maps them
  onto exactly the hashes the scheduler computes for a prompt; ``--kv-replay`` serves missed
  batches.
- **For the fault suite** (lab only): ``GET /debug/served`` is ``{"requests": {id: n}}``, n the
  times this engine queued a call with that request id: vLLM's, i.e. the ``X-Request-Id`` header,
  else the body's ``request_id``, else one of its own.
"""
