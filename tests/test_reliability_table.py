"""docs/reliability.md holds one row per reliability finding, and each names tests that exist.

The ids are the three audits' (H1-H5, M1-M11, L1-L15, N1-N22) and the issue's own list (I1-I7).
A test is named by its pytest node id, `tests/<file>.py::<test>` (a parametrized test without
its parameters, a method as `<Class>::<test>`); it exists when the file, parsed with `ast`,
defines it."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "reliability.md"
IDS = ([f"H{i}" for i in range(1, 6)] + [f"M{i}" for i in range(1, 12)] + [f"L{i}" for i in range(1, 16)]
       + [f"N{i}" for i in range(1, 23)] + [f"I{i}" for i in range(1, 8)])
NODE = re.compile(r"`(tests/[\w/]+\.py)::([\w:]+)`")
ROW_ID = re.compile(r"^\|\s*([HMLNI]\d+)\s*\|")


def rows(text: str) -> dict[str, list[tuple[str, str]]]:
    """{id: [(file, test), ...]} of the table's rows (a row's tests are in its last cell)."""
    out = {}
    for line in text.splitlines():
        m = ROW_ID.match(line)
        if m:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out.setdefault(m.group(1), []).extend(NODE.findall(cells[-1]) if len(cells) == 4 else [("?", "?")])
    return out


def defined(path: Path) -> set[str]:
    """Node names a test file defines: its functions and Class::method."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def problems(text: str, root: Path = REPO) -> list[str]:
    found, bad, cache = rows(text), [], {}
    bad += [f"{i}: no row" for i in IDS if i not in found]
    bad += [f"{i}: not a finding id of this page" for i in found if i not in IDS]
    for i, nodes in found.items():
        if not nodes:
            bad.append(f"{i}: names no test")
        for file, test in nodes:
            path = root / file
            if file not in cache:
                cache[file] = defined(path) if path.is_file() else None
            if cache[file] is None:
                bad.append(f"{i}: {file}: no such test file")
            elif test not in cache[file]:
                bad.append(f"{i}: {file}::{test}: no such test")
    return bad


def test_every_finding_has_a_row_and_every_named_test_exists():
    text = PAGE.read_text()
    assert problems(text) == []
    assert sum(1 for line in text.splitlines() if ROW_ID.match(line)) == len(IDS)  # one row each


def test_the_checker_rejects_a_missing_id_and_a_test_that_does_not_exist():
    text = PAGE.read_text()
    without_h3 = "\n".join(line for line in text.splitlines() if not line.startswith("| H3 |"))
    assert problems(without_h3) == ["H3: no row"]
    made_up = text.replace("tests/test_findings_s3.py::test_N5_compare_refuses_runs_of_different_models",
                           "tests/test_findings_s3.py::test_N5_no_such_test")
    assert problems(made_up) == ["N5: tests/test_findings_s3.py::test_N5_no_such_test: no such test"]
    assert problems("| H1 | a | b | `tests/nope.py::test_x` |")[-1] == "H1: tests/nope.py: no such test file"
    assert "H1: names no test" in problems("| H1 | a | b | none |")
