"""TokenPilot's latency model: the features of one request on one instance, in the order θ has
them (the formulas: ``router.py``'s docstring; computed per row in ``kernels.row_features``,
which writes them by these positions), and the prior θ calibration starts from."""

from __future__ import annotations

FEATURES = (
    "steps",
    "steps_x_batch",
    "steps_x_context",
    "prefill_tokens",
    "prefill_pairs",
    "kv_shortfall_blocks",
    "boundary_wait_s",
)
PRIOR = (0.01, 4e-5, 8e-8, 3e-5, 1.5e-9, 0.01, 1.0)
"""A generic H100 7-8B engine, as a soft starting point; calibration replaces it within minutes."""
STEPS = FEATURES.index("steps")
STEPS_X_BATCH = FEATURES.index("steps_x_batch")
STEPS_X_CONTEXT = FEATURES.index("steps_x_context")
PREFILL_TOKENS = FEATURES.index("prefill_tokens")
PREFILL_PAIRS = FEATURES.index("prefill_pairs")
KV_SHORTFALL = FEATURES.index("kv_shortfall_blocks")
BOUNDARY_WAIT = FEATURES.index("boundary_wait_s")
