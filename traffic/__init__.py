"""Traffic into a running TokenFleet through its broker: what ``tokenfleet loadgen`` and ``tokenfleet
batch submit`` publish (``loadgen.py``: a workload's requests onto ``tf.requests``, a batch file
onto ``tf.batch.jobs``, and waiting for their answers as a client does).

A client of the deployables, not one of them: it imports the adapters and the gateway's reading
of OpenAI bodies, never the lab, the command line or ``bench``.
"""
