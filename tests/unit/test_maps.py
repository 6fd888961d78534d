"""The maps cannot go stale: every module, class and function the architecture pages and the
docstrings name exists.

Read: ``docs/architecture/*.md`` and every docstring (module, class, function) of every ``.py``
file of the project's packages (product, ``lab``, ``bench`` and ``tests``). A name is checked in
one of these forms, where ``pkg`` is one of the project's top-level folders:

- a path, ``pkg/.../file.ext`` or ``pkg/.../folder/``: it exists (a glob or ``<placeholder>`` is
  not a path);
- a path and a name, ``pkg/.../file.py:function`` or ``pkg/.../file.py:Class.method``: the file
  defines it;
- a dotted name, ``pkg.module.Class.method`` (or ``pkg.module:attribute``): the longest prefix
  that is a module exists and defines the rest;
- in a code span only, ``Class.member`` where ``Class`` is a class of the project: one class of
  that name has that member; and a file named alone, ``router.py``: a module of the project has
  that file name (where it is, the text around it says);
- in a table row of a folder, ``| `lab/` | ... `demo.py` ... |``: a file or folder of that
  name is somewhere in that folder.

"Defines" is read with ``ast``, nothing is imported: a module's functions, classes, assignments
and imports (followed to the module they come from); a class's methods, class-level and ``self.``
attributes, nested classes, and those of its bases (a base from outside the project may have
anything). Bare single words are not checked: too many are not names.

A stale name is reported as ``file:line: name``. ``PENDING`` lists the ones in files that are
being moved right now, each ``"file: name"``; an entry that is no longer stale fails the test
too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.unit.test_layers import PROJECT as PACKAGES

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = (*PACKAGES, "deploy", "examples", "dashboards", "docs")  # what a path may start with
PAGES = sorted((ROOT / "docs" / "architecture").glob("*.md"))
EXTENSIONS = {"py", "md", "yaml", "yml", "toml", "json", "sql", "txt", "csv", "cfg", "ini", "sh", "log"}

# Look like names of ours, are not: name -> what it is.
NOT_NAMES = {
    "deploy/config/epp-estimate-prefix-cache-config.yaml": "a file of llm-d-router (the llm-d peer)",
    "deploy/config/epp-precise-prefix-cache-config.yaml": "a file of llm-d-router (the llm-d peer)",
    "deploy/config/pd-epp-config.yaml": "a file of llm-d-router (the llm-d P/D peer)",
    "Scheduler.schedule": "vLLM's scheduler, which the simulated engine follows",
    "gateway.access": "the gateway's access logger",
}
PLACEHOLDER = re.compile(r"\b(?:NAME|NNNN)")  # a path's placeholder: "sim/scenarios/NAME.yaml"

# Temporary (issue 49): stale names in files their owners are moving right now. Each entry is
# "file: name"; drop it as soon as the file is fixed (the test fails while a listed name is fine).
PENDING: frozenset[str] = frozenset()

_PKG = "|".join(FOLDERS)
PATH = re.compile(
    rf"(?<![\w./<:-])((?:{_PKG})/[\w./-]*[\w/])(?::([A-Za-z_]\w*(?:\.\w+)*))?(?![\w*<{{$/-]|\.\w)"
)
DOTTED = re.compile(rf"(?<![\w./<-])((?:{'|'.join(PACKAGES)})(?:\.\w+)+)(?::(\w+(?:\.\w+)*))?(?![\w/-]|\.\w)")
MEMBER = re.compile(r"(?<![\w./<:-])([A-Z]\w*)\.([a-z_]\w*(?:\.\w+)*)(?![\w/-]|\.\w)")
CODE = re.compile(r"`+([^`]+)`+")
ROW = re.compile(rf"^\| `((?:{_PKG})/(?:[\w-]+/)*)` \|(.*)$", re.M)  # a folder's row in a table
BARE = re.compile(rf"^(?:[\w-]+\.(?:{'|'.join(sorted(EXTENSIONS))})|[\w-]+/)$")  # alone: "lanes.py", "peers/"
FILE_ALONE = re.compile(r"^[\w-]+\.py$")  # a module named by its file alone: "router.py"
WRAPPED = re.compile(r"\.[ \t]*\n\s*")  # a line break after a dot


@dataclass(frozen=True)
class Stale:
    file: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.name}"


# ---- what the code defines (read with ast) -------------------------------------------------


@cache
def module_path(module: str) -> Path | None:
    """The file (or, for a namespace folder, the folder) of a dotted project module."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return base if base.is_dir() and module.split(".")[0] in PACKAGES else None


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of a body, those nested in compound statements included (expressions are
    not walked: a full ``ast.walk`` of every file would cost seconds)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            nested = getattr(node, field, None)
            if isinstance(nested, list):
                yield from statements(nested)
        if isinstance(node, ast.Match):
            for case in node.cases:
                yield from statements(case.body)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements at a module's top level, those under ``if`` / ``try`` included."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody)
        else:
            yield node


def _bound(node: ast.stmt) -> Iterator[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield node.name
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    yield leaf.id
    elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
        yield node.target.id


@dataclass(frozen=True)
class Symbols:
    """What one module binds: name -> its node (or, for an import, (module, name or None))."""

    module: str
    nodes: dict[str, ast.stmt]
    imports: dict[str, tuple[str, str | None]]
    anything: bool  # a star import or a module __getattr__: any name may exist


@cache
def symbols(module: str) -> Symbols | None:
    path = module_path(module)
    if path is None:
        return None
    if path.is_dir():
        return Symbols(module, {}, {}, anything=False)
    nodes: dict[str, ast.stmt] = {}
    imports: dict[str, tuple[str, str | None]] = {}
    anything = False
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _top_level(tree(path).body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    imports[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    imports[top] = (top, None)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*parent, *([source] if source else [])])
            for alias in node.names:
                if alias.name == "*":
                    anything = True
                else:
                    imports[alias.asname or alias.name] = (source, alias.name)
        for name in _bound(node):
            nodes[name] = node
    return Symbols(module, nodes, imports, anything or "__getattr__" in nodes)


def _members(cls: ast.ClassDef) -> dict[str, ast.stmt]:
    found: dict[str, ast.stmt] = {}
    for node in _top_level(cls.body):
        for name in _bound(node):
            found[name] = node
    for node in statements(cls.body):  # self.x = ... in any method
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            value = target.value if isinstance(target, ast.Attribute) else None
            if isinstance(target, ast.Attribute) and isinstance(value, ast.Name) and value.id == "self":
                found.setdefault(target.attr, node)
    return found


_EMPTY_BASES = {"object", "Protocol", "Generic", "ABC"}


def _base_name(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.Name):
        return expr.id
    return None


def resolves_in_class(module: str, cls: ast.ClassDef, parts: list[str], seen: int = 0) -> bool:
    if not parts or seen > 20:
        return True
    member = _members(cls).get(parts[0])
    if isinstance(member, ast.ClassDef):
        return resolves_in_class(module, member, parts[1:], seen + 1)
    if member is not None:
        return True
    for base in cls.bases:
        name = _base_name(base)
        if name in _EMPTY_BASES:
            continue
        if name is None:
            return True  # a base we cannot read (``module.Base``, a call): it may have it
        found = find_class(module, name)
        if found is None:
            return True  # a base from outside the project
        if resolves_in_class(found[0], found[1], parts, seen + 1):
            return True
    return False


def find_class(module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
    """The project class ``name`` means in ``module`` (following imports), if any."""
    table = symbols(module)
    if table is None or depth > 10:
        return None
    node = table.nodes.get(name)
    if isinstance(node, ast.ClassDef):
        return module, node
    if name in table.imports:
        source, original = table.imports[name]
        if original is not None and source.split(".")[0] in PACKAGES:
            return find_class(source, original, depth + 1)
    return None


def resolves_in_module(module: str, parts: list[str], depth: int = 0) -> bool:
    table = symbols(module)
    if table is None:
        return False
    if not parts or depth > 10:
        return True
    name, rest = parts[0], parts[1:]
    node = table.nodes.get(name)
    if isinstance(node, ast.ClassDef):
        return resolves_in_class(module, node, rest)
    if node is not None:
        return True  # a function or a value: what it holds is not read
    if name in table.imports:
        source, original = table.imports[name]
        if source.split(".")[0] not in PACKAGES:
            return True
        if original is None:
            return resolves_in_module(source, rest, depth + 1)
        if symbols(f"{source}.{original}") is not None:  # from package import submodule
            return resolves_in_module(f"{source}.{original}", rest, depth + 1)
        return resolves_in_module(source, [original, *rest], depth + 1)
    if symbols(f"{module}.{name}") is not None:
        return resolves_in_module(f"{module}.{name}", rest, depth + 1)
    return table.anything


def resolves_dotted(dotted: str, attribute: str | None = None) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module_path(module) is not None:
            rest = parts[cut:] + (attribute.split(".") if attribute else [])
            return resolves_in_module(module, rest)
    return False


@cache
def classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Every class of the project, by name: (module, class)."""
    found: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for path in python_files():
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in statements(tree(path).body):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append((module, node))
    return found


# ---- what the maps name ----------------------------------------------------------------------


@cache
def python_files() -> tuple[Path, ...]:
    return tuple(path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py")))


@cache
def python_file_names() -> frozenset[str]:
    return frozenset(path.name for path in python_files())


def texts() -> Iterator[tuple[str, int, str]]:
    """(file, first line, text) of every page and every docstring."""
    for page in PAGES:
        yield str(page.relative_to(ROOT)), 1, page.read_text()
    for path in python_files():
        module = tree(path)
        for node in [module, *statements(module.body)]:
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield str(path.relative_to(ROOT)), node.body[0].lineno, docstring


def references(text: str) -> Iterator[tuple[int, str, bool]]:
    """(offset, name, whether it resolves) of each name the text gives in a checked form."""
    for match in PATH.finditer(text):
        path, attribute = match.group(1), match.group(2)
        if PLACEHOLDER.search(path):
            continue
        if path.endswith("/"):
            ok = (ROOT / path).is_dir()
        elif "." not in path.rsplit("/", 1)[-1]:
            continue  # neither a file nor a folder: "tokenfleet/lab", "agents/policy"
        else:
            ok = (ROOT / path).exists()
        if ok and attribute and path.endswith(".py"):
            module = ".".join(Path(path).with_suffix("").parts).removesuffix(".__init__")
            ok = resolves_in_module(module, attribute.split("."))
        yield match.start(), match.group(0), ok
    for row in ROW.finditer(text):  # "| `lab/` | ... `stack/` ... `demo.py` |": somewhere in lab/
        folder = ROOT / row.group(1)
        for span in CODE.finditer(row.group(2)):
            if BARE.match(span.group(1)) and folder.is_dir():
                yield (
                    row.start(2) + span.start(1),
                    f"{row.group(1)}**/{span.group(1)}",
                    _under(folder, span.group(1)),
                )
    for match in DOTTED.finditer(text):
        yield from _dotted(match, match.start())
    for span in CODE.finditer(text):
        code = span.group(1)
        if WRAPPED.search(code):  # a dotted name wrapped after a dot: read joined again
            plain = {match.group(0) for match in DOTTED.finditer(code)}
            for match in DOTTED.finditer(WRAPPED.sub(".", code)):
                if match.group(0) not in plain:
                    yield from _dotted(match, span.start(1))
        if FILE_ALONE.match(code):
            yield span.start(1), code, code in python_file_names()
        for match in MEMBER.finditer(span.group(1)):
            candidates = classes().get(match.group(1))
            if not candidates:
                continue  # not a class of the project (a library's, or a word)
            parts = match.group(2).split(".")
            ok = any(resolves_in_class(module, cls, parts) for module, cls in candidates)
            yield span.start(1) + match.start(), match.group(0), ok


def _under(folder: Path, name: str) -> bool:
    """Whether a file (``name.ext``) or a folder (``name/``) of that name is somewhere in ``folder``."""
    if name.endswith("/"):
        return any(path.is_dir() for path in folder.rglob(name.rstrip("/")))
    return any(folder.rglob(name))


def _dotted(match: re.Match[str], offset: int) -> Iterator[tuple[int, str, bool]]:
    dotted, attribute = match.group(1), match.group(2)
    if dotted.rsplit(".", 1)[-1] not in EXTENSIONS:  # else a file name: "traffic.py"
        yield offset, match.group(0), resolves_dotted(dotted, attribute)


@cache
def stale_names() -> tuple[Stale, ...]:
    found = []
    for file, first, text in texts():
        for offset, name, ok in references(text):
            if not ok and name not in NOT_NAMES:
                found.append(Stale(file, first + text.count("\n", 0, offset), name))
    return tuple(found)


# ---- the tests -------------------------------------------------------------------------------


def test_every_name_on_the_maps_exists() -> None:
    stale = [s for s in stale_names() if f"{s.file}: {s.name}" not in PENDING]
    assert [str(s) for s in stale] == []


def test_every_pending_name_is_still_stale() -> None:
    still = {f"{s.file}: {s.name}" for s in stale_names()}
    assert sorted(PENDING - still) == []


def test_the_resolver_tells_a_stale_name_from_a_live_one() -> None:
    live = [
        "`agents/policy/tokenpilot/router.py`",
        "`agents/policy/pipeline.py:Scheduler.submit`",
        "``agents.policy.lanes.Lane``",
        "``agents.policy.Scheduler.tick``",  # through the package's import
        "`cli.main:app`",
        "`docs/architecture/`",
        "`InstanceSelector.place`",
        "`InstanceSelector.in_flight`",  # set on self
        "`router.py`",
    ]
    stale = [
        "`agents/policy/no_such_module.py`",
        "`agents/policy/pipeline.py:Scheduler.no_such_method`",
        "``agents.policy.lanes.NoSuchLane``",
        "``agents.policy.no_such_module.Lane``",
        "`InstanceSelector.no_such_hook`",
        "`no_such_module.py`",
    ]
    for text in live:
        assert [ok for _, _, ok in references(text)] == [True], text
    # A dotted name wrapped after a dot is read joined, as well as up to the dot.
    assert [ok for _, _, ok in references("``infra.kafka.clients.\n    LogWatch``")] == [True, True]
    assert [ok for _, _, ok in references("``infra.kafka.clients.\n    NoSuchWatch``")] == [True, False]
    for text in stale:
        assert [ok for _, _, ok in references(text)] == [False], text
    # Not names: a glob, a placeholder, a file name, a word, a class of a library.
    for text in ["`docs/*.md`", "`tests/unit/<package>/`", "`worker.log`", "`Lane`", "`Path.exists`"]:
        assert list(references(text)) == [], text
