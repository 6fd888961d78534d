"""The fleet simulator: instance engine model, workloads, the discrete-event runner, metrics."""
