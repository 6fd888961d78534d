"""The event loops: the discrete-event runner, the real-time driver, and the client rules both follow."""
