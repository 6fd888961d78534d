"""``kernel``: numba's ``njit`` for the pure core's hot loops, with its compilations cached on disk.

numba compiles a kernel the first time it is called with a given set of argument types (a few
hundred milliseconds per kernel) and, with ``cache=True``, keeps the machine code on disk, so a
later process loads it in milliseconds. numba writes that cache beside the source file
(``__pycache__``) when it can, else under the user's cache directory (``~/.cache/numba``); where
neither is writable (a read-only install run by a user without a home), numba refuses to decorate
the function at all. Then the cache goes to ``$TMPDIR/tokenfleet-numba-<user>``, and only if that
cannot be written either are the kernels compiled at every start. ``NUMBA_CACHE_DIR`` overrides
all of this, as numba documents.

numba itself is imported when a module's first kernel is first called, not when the module is
imported: a process that imports the policy package without deciding (the gateway, the
dispatcher) does not pay numba's memory and import time. At that first call every kernel of the
module becomes numba's dispatcher in the module's namespace (so kernels calling each other by
name compile together, and ``module.kernel(...)`` calls numba directly from then on).

Kernels are compiled without fast-math: IEEE float64 operations in the order the source states
them (no reassociation, no fused multiply-add), so a kernel computes bit for bit what the same
formula computes in numpy, element by element. ``NUMBA_DISABLE_JIT=1`` runs them as plain Python
(slow; for debugging). A kernel calls kernels of its own module only: numba's cache knows the
source file of the function it caches, not those of the functions it calls.
"""

from __future__ import annotations

import functools
import getpass
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

_SOURCE = "__kernel_source__"  # attribute of a kernel not compiled yet: its Python function


def fallback_cache_dir() -> str:
    """Where kernels are cached when numba has no writable location of its own."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        getuid = getattr(os, "getuid", None)  # (not on every platform)
        user = str(getuid()) if getuid is not None else "user"
    return os.path.join(tempfile.gettempdir(), f"tokenfleet-numba-{user}")


def kernel(func: F) -> F:
    """``func``, to be compiled by numba (nopython mode) at its module's first kernel call, its
    compilations cached on disk where possible (module docstring)."""

    @functools.wraps(func)
    def first_call(*args: Any) -> Any:
        compiled: Callable[..., Any] = compile_module(func.__module__)[func.__name__]
        return compiled(*args)

    setattr(first_call, _SOURCE, func)
    return cast(F, first_call)


def compile_module(name: str) -> dict[str, Any]:
    """Replace every kernel of module ``name`` not compiled yet by numba's dispatcher (compiling
    lazily, per argument types); its namespace."""
    namespace = vars(sys.modules[name])
    for attribute, value in list(namespace.items()):
        source = getattr(value, _SOURCE, None)
        if source is not None:
            namespace[attribute] = _njit(source)
    return namespace


def _njit(func: Callable[..., Any]) -> Callable[..., Any]:
    import numba
    from numba.core import config as numba_config

    try:
        return cast(Callable[..., Any], numba.njit(cache=True)(func))
    except RuntimeError:  # "cannot cache function ...: no locator available"
        numba_config.CACHE_DIR = fallback_cache_dir()  # type: ignore[attr-defined]  # (set from the environment)
        try:
            return cast(Callable[..., Any], numba.njit(cache=True)(func))
        except RuntimeError:
            return cast(Callable[..., Any], numba.njit(cache=False)(func))
