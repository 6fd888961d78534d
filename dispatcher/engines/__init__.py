"""Inference engines behind one port (``port.EnginePort``): emulated today, real ones next.

Only the port is re-exported: importing it must not pull in an implementation (the emulated
one imports the simulator).
"""

from dispatcher.engines.port import Endpoint, EngineError, EngineEvent, EnginePort

__all__ = ["Endpoint", "EngineError", "EngineEvent", "EnginePort"]
