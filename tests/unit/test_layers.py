"""The import arrows point inward: deployables -> adapters -> agents -> agents.policy -> plain data.

Checked on the source (every module's import statements, lazy ones inside functions included):
- the pure core (``agents.policy``) imports only the standard library, numpy and itself, and
  numba in its one module of compiled kernels' decorator (``agents/policy/common/compiled.py``);
- ``schemas`` imports nothing of the project; ``agents`` nothing of streams, infra, sim, bench;
- ``streams`` and the simulator never import the adapters (``infra``) or a deployable, and the
  adapters never import the simulator;
- the deployables (``worker``, ``dispatcher``, ``gateway``, ``planner``) never import one
  another; the stack on one machine (``local``: ``tokenfleet up``) and the traffic into it
  (``traffic``) import the deployables and the adapters;
- product code (the command line included) never imports the lab, ``bench`` or ``tests``; the lab
  never imports the command line;
- the judge of violations (``sim/evaluation/violations.py``) shares no code with the policy it
  judges: it imports nothing of ``agents.policy.fleetmind``, and importing it loads none of it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = (
    "agents",
    "schemas",
    "streams",
    "infra",
    "sim",
    "worker",
    "dispatcher",
    "gateway",
    "planner",
    "local",
    "traffic",
    "cli",
    "lab",
    "bench",
    "tests",
)
ADAPTERS = ("infra", "agents", "streams", "schemas", "sim")
DEPLOYABLES = ("worker", "dispatcher", "gateway", "planner")
PRODUCT = ("agents", "schemas", "streams", "infra", "sim", *DEPLOYABLES, "local", "traffic", "cli")


def imports_of(package: str) -> dict[str, set[str]]:
    """module file -> top-level names of everything it imports (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def offenders(package: str, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for module, names in imports_of(package).items():
        wrong = sorted(n for n in names if n.split(".")[0] in PROJECT and not n.startswith(allowed))
        if wrong:
            bad[module] = wrong
    return bad


def test_the_pure_core_imports_only_stdlib_numpy_and_itself() -> None:
    def allowed(module: str, name: str) -> bool:
        top = name.split(".")[0]
        if top == "numba":  # the compiler, behind one decorator
            return module == "agents/policy/common/compiled.py"
        return top in sys.stdlib_module_names or top == "numpy" or name.startswith("agents.policy")

    bad = {
        m: sorted(n for n in names if not allowed(m, n)) for m, names in imports_of("agents/policy").items()
    }
    assert {m: names for m, names in bad.items() if names} == {}


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("schemas", ("schemas",)),
        ("agents", ("agents", "schemas")),
        ("streams", ("streams", "agents", "schemas")),
        ("sim", ("sim", "agents.policy", "schemas")),
        ("infra", ("infra", "agents", "streams", "schemas")),
        ("worker", ("worker", *ADAPTERS)),
        ("dispatcher", ("dispatcher", *ADAPTERS)),
        ("gateway", ("gateway", *ADAPTERS)),
        ("planner", ("planner", *ADAPTERS)),
        ("local", ("local", *DEPLOYABLES, *ADAPTERS)),
        ("traffic", ("traffic", "gateway", *ADAPTERS)),
        ("cli", ("cli", "local", "traffic", *DEPLOYABLES, *ADAPTERS)),
        ("lab", ("lab", "local", "traffic", *DEPLOYABLES, *ADAPTERS)),
        ("bench", ("bench", "lab", "local", "traffic", *DEPLOYABLES, *ADAPTERS)),
    ],
)
def test_layers_import_only_inward(package: str, allowed: tuple[str, ...]) -> None:
    assert offenders(package, allowed) == {}


def test_the_judge_of_violations_shares_no_code_with_fleetmind() -> None:
    judge = "sim/evaluation/violations.py"
    names = imports_of("sim/evaluation")[judge]  # type-only imports included
    assert sorted(n for n in names if n.startswith("agents")) == []
    # Nor through another module, at run time: a fresh interpreter that imports the judge has
    # loaded nothing of the project but the judge and its packages.
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, sim.evaluation.violations; print(*sorted(sys.modules))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    project = sorted(m for m in loaded if m.split(".")[0] in PROJECT)
    assert project == ["sim", "sim.evaluation", "sim.evaluation.violations"]
