"""The fleet simulator: engine model (``engine/``), workloads, event loops (``loop/``: discrete-event
and real-time) and evaluation (metrics, bounds, reports, the scoreboard)."""
