"""TokenFleet agents: the pure policy core (``agents.policy``) and, later, thin Faust agents."""
