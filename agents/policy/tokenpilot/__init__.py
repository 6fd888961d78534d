"""TokenPilot: predicted-TTFT instance selection with an online-calibrated latency predictor."""

from agents.policy.tokenpilot.predictor import OnlineLinearModel
from agents.policy.tokenpilot.router import TokenPilot

__all__ = ["OnlineLinearModel", "TokenPilot"]
