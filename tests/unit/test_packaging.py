"""The wheel is the product: built from a copy of this checkout, it holds the product's packages
(no ``lab``, ``bench`` or ``tests``), no module of it imports the lab, ``bench`` or ``tests``, it
carries the data files the product reads (migrations, traces, scenarios), and the build prints
no deprecation warning (the licence is an SPDX string)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

from tests.unit.test_layers import PRODUCT, ROOT

NOT_SHIPPED = ("lab", "bench", "tests")
# What the build reads or nobody needs: caches, environments, outputs, the site, git.
_SKIP = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "out", ".tokenfleet", "*.egg-info", "__pycache__", ".*_cache",
    ".hypothesis", "site", "docs",
)  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[zipfile.ZipFile, str]:
    """The wheel ``pip wheel`` builds from a fresh copy of the checkout (no stale ``build/``),
    and the build's output."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(ROOT, source, ignore=_SKIP)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--disable-pip-version-check",
         "-w", str(work / "dist"), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (path,) = (work / "dist").glob("tokenfleet-*.whl")
    return zipfile.ZipFile(path), built.stdout + built.stderr


def test_the_wheel_holds_the_product_packages_only(wheel: tuple[zipfile.ZipFile, str]) -> None:
    archive, _ = wheel
    tops = {
        name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")
    }
    assert tops == set(PRODUCT)
    assert not tops & set(NOT_SHIPPED)


def test_no_module_of_the_wheel_imports_the_lab_bench_or_tests(wheel: tuple[zipfile.ZipFile, str]) -> None:
    archive, _ = wheel
    bad = {}
    for name in archive.namelist():
        if not name.endswith(".py"):
            continue
        imported: set[str] = set()
        for node in ast.walk(ast.parse(archive.read(name), name)):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module)
        wrong = sorted(n for n in imported if n.split(".")[0] in NOT_SHIPPED)
        if wrong:
            bad[name] = wrong
    assert bad == {}


def test_the_wheel_carries_the_data_the_product_reads(wheel: tuple[zipfile.ZipFile, str]) -> None:
    archive, _ = wheel
    names = set(archive.namelist())
    for pattern in ("infra/clickhouse/migrations/*.sql", "sim/traces/*/*", "sim/scenarios/*.yaml"):
        files = {str(path.relative_to(ROOT)) for path in ROOT.glob(pattern)}
        assert files and files <= names, pattern
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module = scripts["tokenfleet"].split(":")[0]
    assert module.replace(".", "/") + ".py" in names


def test_the_build_warns_of_nothing_deprecated(wheel: tuple[zipfile.ZipFile, str]) -> None:
    _, output = wheel
    assert "Deprecat" not in output and "deprecat" not in output, output[-3000:]
