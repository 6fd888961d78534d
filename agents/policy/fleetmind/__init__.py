"""FleetMind: which data centre (hard rules, then total cost), and the DC baselines it is judged by."""

from agents.policy.fleetmind.baselines import GlobalLeastLoad, LocalOnly
from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.fleetmind.rules import FleetRules, parse_rules
from agents.policy.fleetmind.stage import FleetMind

__all__ = ["FleetMind", "FleetNotice", "FleetRules", "GlobalLeastLoad", "LocalOnly", "parse_rules"]
