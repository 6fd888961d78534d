"""Faust app factory, topic and table bindings, the codec, and the table -> ClusterView adapter."""
