"""Floors that hold: every import of a roofline module (function-level ones included) points to
its own floor or one below, the library never imports Hydra or roofline/cli/, and no two modules
import each other, directly or round a circle. The floor order is docs/design.md's ("Floors")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# lowest first; the packages of one floor may import each other (no circle of modules, though)
FLOORS = ["io", "model", "checkpoints", "measure parallel", "analysis", "report", "spec train", "commands", "cli"]
NOT_IN_THE_LIBRARY = ("hydra", "omegaconf")
# the entry points: the one package of roofline that imports Hydra (and the top floor: nothing
# below imports it)
ENTRY_POINTS = "roofline.cli"


def floor_of(module: str) -> int:
    """The floor index of a module `roofline.<package>...`."""
    package = module.split(".")[1]
    return next(i for i, names in enumerate(FLOORS) if package in names.split())


def modules(root: Path = ROOT) -> dict[str, Path]:
    """{dotted name: file} of every module under roofline/ (a package by its __init__)."""
    out = {}
    for path in sorted((root / "roofline").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function or class) for every import statement of the
    file, relative ones resolved; `from pkg import mod` names the module mod."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    top |= {id(n) for stmt in tree.body if isinstance(stmt, (ast.If, ast.Try)) for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found += [(t, node.lineno, id(node) not in top) for t in targets]
    return found


def graph(root: Path = ROOT) -> list[tuple[str, str, int, bool]]:
    """(importer, imported, line, function-level) for every import of the library by the library,
    and of anything in NOT_IN_THE_LIBRARY."""
    mods = modules(root)
    edges = []
    for name, path in mods.items():
        for target, line, inner in imports(name, path, set(mods)):
            if target.split(".")[0] in NOT_IN_THE_LIBRARY:
                edges.append((name, target, line, inner))
            elif target.startswith("roofline."):
                while target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                edges.append((name, target, line, inner))
    return edges


def upward(edges) -> list[str]:
    return [f"{a}:{line} imports {b}{' (in a function)' if inner else ''}" for a, b, line, inner in edges
            if b.startswith("roofline.") and a.count(".") and b.count(".") and floor_of(b) > floor_of(a)]


def circles(edges) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), function-level imports
    counted; a module importing its own package's __init__ is not a circle."""
    succ: dict[str, set[str]] = {}
    for a, b, _, _ in edges:
        if b.startswith("roofline.") and a != b and not a.startswith(b + "."):
            succ.setdefault(a, set()).add(b)
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return out


EDGES = graph()


def test_every_package_has_a_floor():
    packages = {p.name for p in (ROOT / "roofline").iterdir() if (p / "__init__.py").is_file()}
    placed = {name for floor in FLOORS for name in floor.split()}
    assert packages == placed, f"packages without a floor: {packages - placed}; floors without a package: {placed - packages}"


def test_no_import_goes_up_a_floor():
    assert not upward(EDGES), "\n".join(upward(EDGES))


def test_the_library_never_imports_hydra_or_the_entry_points():
    bad = [f"{a}:{line} imports {b}" for a, b, line, _ in EDGES
           if b.split(".")[0] in NOT_IN_THE_LIBRARY and not (a + ".").startswith(ENTRY_POINTS + ".")]
    assert not bad, "\n".join(bad)


def test_no_modules_import_each_other():
    assert not circles(EDGES), circles(EDGES)


def test_the_walk_sees_function_level_imports_and_the_checks_can_fail(tmp_path):
    pkg = tmp_path / "roofline"
    for sub in ("io", "model"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "io" / "files.py").write_text("def f():\n    from roofline.model import accounting\n")
    (pkg / "model" / "accounting.py").write_text("from ..io import files\nimport hydra\n")
    edges = graph(tmp_path)
    assert ("roofline.io.files", "roofline.model.accounting", 2, True) in edges
    assert ("roofline.model.accounting", "roofline.io.files", 1, False) in edges
    assert upward(edges) == ["roofline.io.files:2 imports roofline.model.accounting (in a function)"]
    assert circles(edges) == [["roofline.io.files", "roofline.model.accounting"]]
    assert ("roofline.model.accounting", "hydra", 2, False) in edges


COMMAND_NAMES = sorted(p.stem for p in (ROOT / "roofline" / "commands").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("entry", COMMAND_NAMES)
def test_an_entry_point_is_its_command_and_nothing_else(entry):
    """roofline/cli/<cmd>.py exists for every command module and holds no logic: a docstring,
    `from roofline.cli.entry import main_of`, `main = main_of("<cmd>")` and the __main__ guard."""
    tree = ast.parse((ROOT / "roofline" / "cli" / f"{entry}.py").read_text())
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    assert [ast.unparse(n) for n in body] == ["from roofline.cli.entry import main_of", f"main = main_of('{entry}')",
                                              "if __name__ == '__main__':\n    main()"]
