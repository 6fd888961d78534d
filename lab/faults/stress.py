"""A busy machine on demand: ``count`` CPU burners beside a fault scenario.

Each burner is a child Python process (this interpreter, ``python -c``) that spins forever on
pure-Python integer arithmetic: one runnable thread that never sleeps and never does I/O, so it
takes a whole core whenever the scheduler gives it one, at the default priority (the same
``nice`` as the suite's broker, workers and fleet). ``count`` burners on a machine with ``c``
cores leave the system under test about ``c / (c + count)`` of the machine's CPU when it wants
all of it (on two cores with ``--stress 2``: half), which is what "a busy machine" means here:
a simulator and a test stack sharing the cores. Nothing else about the machine changes (no
memory or disk pressure).

``Stress`` is a context manager: the burners start on entry and are killed (SIGKILL, by their
pid) and reaped on exit; ``count == 0`` starts nothing.
"""

from __future__ import annotations

import subprocess
import sys
from types import TracebackType

BURNER = "x = 0\nwhile True:\n    x = (x * 1103515245 + 12345) % 2147483648\n"
"""The burner's program: a linear congruential step, forever (no allocation that grows)."""


class Stress:
    """``count`` CPU burners (module docstring) while the ``with`` block runs."""

    def __init__(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"stress must be >= 0, got {count}")
        self.count = count
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Stress:
        for _ in range(self.count):
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", BURNER],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait()
        self.processes.clear()
