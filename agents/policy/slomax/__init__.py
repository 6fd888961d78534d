"""SLOMax: admission, queue pools and capacity shares, closed-loop on observed goodput."""

from agents.policy.slomax.admission import SloMax

__all__ = ["SloMax"]
