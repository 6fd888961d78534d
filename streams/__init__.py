"""The Faust side: the app factory, the binding of the stream handlers to it and the publisher,
the snapshot cache (instance-state table -> ``ClusterView``), the request lane."""
