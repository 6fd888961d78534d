"""The worker: the scheduler deployable (``tokenfleet worker``).

A supervisor (``supervisor.py``) runs the Faust worker as its own child process (``child.py``)
and restarts it; the child's watchdog (``watchdog.py``) stops it when it no longer consumes; the
ready marker (``ready.py``) says when a child serves. The decisions themselves are made by the
stream handlers in ``streams/`` and ``agents/`` on the pure ``agents.policy.Scheduler``, wired
by ``infra/bootstrap.py``.
"""
