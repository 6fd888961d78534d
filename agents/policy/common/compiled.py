"""``kernel``: numba's ``njit`` for the pure core's hot loops, with its compilations cached on disk.

numba compiles a kernel the first time it is called with a given set of argument types (a few
hundred milliseconds per kernel) and, with ``cache=True``, keeps the machine code on disk, so a
later process loads it in milliseconds. numba writes that cache beside the source file
(``__pycache__``) when it can, else under the user's cache directory (``~/.cache/numba``); where
neither is writable (a read-only install run by a user without a home), numba refuses to decorate
the function at all. Then the cache goes to ``$TMPDIR/tokenfleet-numba-<user>``, and only if that
cannot be written either are the kernels compiled at every start. ``NUMBA_CACHE_DIR`` overrides
all of this, as numba documents.

Kernels are compiled without fast-math: IEEE float64 operations in the order the source states
them (no reassociation, no fused multiply-add), so a kernel computes bit for bit what the same
formula computes in numpy, element by element. ``NUMBA_DISABLE_JIT=1`` runs them as plain Python
(slow; for debugging).
"""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
from numba.core import config as numba_config

F = TypeVar("F", bound=Callable[..., Any])


def fallback_cache_dir() -> str:
    """Where kernels are cached when numba has no writable location of its own."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"tokenfleet-numba-{user}")


def kernel(func: F) -> F:
    """``func`` compiled by numba (nopython mode), its compilations cached on disk where possible
    (module docstring)."""
    try:
        compiled = numba.njit(cache=True)(func)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        numba_config.CACHE_DIR = fallback_cache_dir()  # type: ignore[attr-defined]  # (set from the environment)
        try:
            compiled = numba.njit(cache=True)(func)
        except RuntimeError:
            compiled = numba.njit(cache=False)(func)
    return cast(F, compiled)
