"""The planner: the fleet's shape over minutes (``tokenfleet planner``).

It reads what the fleet does (heartbeats, requests, admission decisions, completions), asks a
planner of ``agents/policy/planners`` every interval how many replicas of each model version
each data centre should run, and publishes the answer on ``tf.plans`` and on the
``tokenfleet_desired_replicas`` gauge, for whatever starts and drains replicas (``tokenfleet up``,
KEDA, an HPA). One planner per fleet is active (a Kafka consumer group decides which); the others
wait, and any of them rebuilds its state from the topics. ``main.py`` is the process (settings,
fleet file, probes), ``service.py`` the loop (topics in, plans out), ``fleet_state.py`` the
topics folded into the planners' ``FleetState``.
"""
