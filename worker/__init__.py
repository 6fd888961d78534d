"""The worker: the scheduler deployable (``tokenfleet worker``).

A supervisor (``supervisor.py``) runs the Faust worker as its own child process (``child.py``)
and restarts it; the child's watchdog (``watchdog.py``) stops it when it no longer consumes; the
ready marker (``ready.py``) says when a child serves. The decisions themselves are made by the
stream handlers in ``streams/`` and ``agents/`` on the pure ``agents.policy.Scheduler``, wired
by ``wiring.py`` from its parts: ``scheduling.py`` (the policy, one scheduler per pool, the
routing service), ``readers.py`` (the Kafka readers), ``store.py`` (the feedback store and its
feed from the log), ``probes.py`` (health, ``/metrics``, ``/health``, ``/ready``) and
``decision_memory.py`` (decisions handed to the next process).
"""
