"""The package's structure as designed: no import cycles between modules anywhere in celosia,
and the compiler's stages import only as ``celosia.compiler.STAGE_IMPORTS`` allows.

Every import counts, including those inside functions: a cycle dodged by a lazy import is
still a cycle.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from celosia.compiler import STAGE_IMPORTS

ROOT = Path(__file__).resolve().parent.parent


def _package_dirs() -> dict[str, Path]:
    """{package name: folder} from pyproject's package-dir (folders of the repository)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in cfg["package-dir"].items()}


def _modules() -> dict[str, Path]:
    dirs = _package_dirs()
    top = {d.resolve() for name, d in dirs.items() if name != "celosia"}
    mods = {}
    for pkg, folder in dirs.items():
        for path in folder.rglob("*.py"):
            if pkg == "celosia" and any(p.resolve() in top for p in path.parents):
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = path
    return mods


def _imports(name: str, path: Path, mods: dict) -> set[str]:
    """The celosia modules ``name`` imports (a package for ``from pkg import module`` counts
    as the module)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]) \
                if node.level else node.module
            base = base.rstrip(".")
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_anywhere():
    cycles = _cycles(_graph())
    assert not cycles, "modules that import each other in a circle: " + "; ".join(
        " <-> ".join(c) for c in cycles)


def _stage(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["celosia", "compiler"] or len(parts) < 3:
        return None
    return parts[2]


def test_compiler_stages_import_only_downward():
    wrong = []
    for module, targets in _graph().items():
        stage = _stage(module)
        if stage is None:
            continue
        for target in targets:
            to = _stage(target)
            if to is not None and to != stage and to not in STAGE_IMPORTS[stage]:
                wrong.append(f"{module} imports {target} ({stage} -> {to})")
    assert not wrong, "imports against the stage order:\n" + "\n".join(sorted(wrong))


def test_nothing_in_the_compiler_imports_the_runtime_or_the_models():
    wrong = [f"{m} imports {t}" for m, ts in _graph().items() if _stage(m)
             for t in ts if t.startswith(("celosia.runtime", "celosia.models",
                                          "celosia.benchmarks", "celosia.cli"))]
    assert not wrong, wrong


def test_every_compiler_folder_is_a_declared_stage():
    folder = _package_dirs()["celosia.compiler"]
    top_modules = sorted(p.name for p in folder.glob("*.py"))
    assert top_modules == ["__init__.py", "pipeline.py"]
    stages = sorted(p.name for p in folder.iterdir()
                    if p.is_dir() and (p / "__init__.py").exists())
    assert stages == sorted(s for s in STAGE_IMPORTS if s != "pipeline")
    for stage in stages:
        doc = ast.get_docstring(ast.parse((folder / stage / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"{stage}/__init__.py must say what it may import"


@pytest.mark.parametrize("package", sorted(_package_dirs()))
def test_every_folder_with_python_is_a_declared_package(package):
    """Every folder of a package that holds Python is itself a package in pyproject (so a
    wheel carries it)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folder = _package_dirs()[package]
    for sub in folder.rglob("__init__.py"):
        parts = sub.parent.relative_to(folder).parts
        if package == "celosia" and parts:
            continue
        assert ".".join([package, *parts]) in cfg["packages"], sub
