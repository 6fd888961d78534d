"""Evaluation: metrics, the ``ideal`` bounds, policies side by side, reports, the TokenPilot scoreboard."""
