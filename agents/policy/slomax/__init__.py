"""SLOMax: admission, queue pools and capacity shares, closed-loop on measured goodput."""

from agents.policy.slomax.admission import SloMax

__all__ = ["SloMax"]
