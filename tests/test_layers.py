"""The layers import one way (docs/DESIGN.md, "Layers"): the WebNN library at the bottom, then
the model, then the backends that use both, then the harness. Every import in every module,
function-level ones included, is read with ``ast``; one pointing up fails the test."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: bottom to top; a module may import its own layer and the ones below it
LAYERS = ("backends.webnn", "model", "backends", "harness")
#: what the WebNN library may import besides itself and the standard library
WEBNN_THIRD_PARTY = {"numpy", "wgpu", "onnx"}
PROJECT_ROOTS = {"backends", "model", "harness", "benchmarks", "scripts", "tests"}


def layer_of(module: str) -> int | None:
    """Index into LAYERS of the most specific layer holding `module` (None: not layered)."""
    best = None
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(LAYERS[best]):
                best = i
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import statement in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from backends import webnn` names a submodule: record it as one
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names
                      if (ROOT / Path(*target.split("."), alias.name)).exists()
                      or (ROOT / Path(*target.split("."), alias.name + ".py")).exists()]
    return found


def layered_files() -> list[Path]:
    return sorted(p for top in ("backends", "model", "harness") for p in (ROOT / top).rglob("*.py"))


def test_the_layers_exist() -> None:
    names = {module_name(p) for p in layered_files()}
    for prefix in LAYERS:
        assert prefix in names, f"layer {prefix} has no package"


@pytest.mark.parametrize("path", layered_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_points_up(path: Path) -> None:
    own = layer_of(module_name(path))
    up = [f"{path.relative_to(ROOT)}:{line} imports {target} ({LAYERS[layer_of(target)]})"
          for line, target in imports_of(path)
          if layer_of(target) is not None and layer_of(target) > own]
    assert not up, "an import points up a layer:\n" + "\n".join(up)


@pytest.mark.parametrize("path", sorted((ROOT / "backends" / "webnn").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_webnn_depends_only_on_numpy_wgpu_onnx(path: Path) -> None:
    foreign = []
    for line, target in imports_of(path):
        top = target.split(".")[0]
        if target == "backends.webnn" or target.startswith("backends.webnn."):
            continue
        if top in PROJECT_ROOTS or (top not in sys.stdlib_module_names and top not in WEBNN_THIRD_PARTY
                                    and top != "__future__"):
            foreign.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not foreign, "backends/webnn must stand alone:\n" + "\n".join(foreign)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The rule itself: a model module importing the harness, at function level, is caught."""
    bad = ROOT / "model" / "_layer_probe_tmp.py"
    bad.write_text("def f():\n    from harness import runner\n    return runner\n")
    try:
        hits = [t for _, t in imports_of(bad) if layer_of(t) is not None and layer_of(t) > layer_of("model")]
        assert hits == ["harness", "harness.runner"]
    finally:
        bad.unlink()


#: the packages whose private names (``_x``) stay their own
PACKAGES = LAYERS


def package_of(module: str) -> str | None:
    i = layer_of(module)
    return None if i is None else PACKAGES[i]


def private_imports(path: Path) -> list[str]:
    """'line: target.name' for each private name the file imports from another package: a
    ``_name`` imported, or a module path through a ``_module``."""
    own = package_of(module_name(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target + "." + a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for full in names:
            if package_of(full) in (None, own):
                continue
            inside = full[len(package_of(full)):].split(".")
            if any(p.startswith("_") and not p.startswith("__") for p in inside):
                found.append(f"{node.lineno}: {full}")
    return found


@pytest.mark.parametrize("path", layered_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_name_crosses_a_package(path: Path) -> None:
    """A package's private names (``backends.pages._Page``) are its own: another package
    asks the public surface (``backends.base.Backend``), so a private one can change."""
    found = private_imports(path)
    assert not found, f"{path.relative_to(ROOT)} imports private names of another package: {found}"


def test_the_checker_sees_a_private_import() -> None:
    bad = ROOT / "harness" / "_layer_probe_tmp.py"
    bad.write_text("from backends.pages import _Page\nfrom backends.webnn import _classes\n"
                   "from harness.results import _plain_copy\nimport backends.base\n")
    try:
        assert private_imports(bad) == ["1: backends.pages._Page", "2: backends.webnn._classes"]
    finally:
        bad.unlink()


#: what would mean the harness picks code by a backend's name (``Backend`` says what it asks)
BY_NAME = ('startswith("ort-', "startswith('ort-", 'startswith("wgpu', "startswith('wgpu", "_Page")


@pytest.mark.parametrize("path", sorted((ROOT / "harness").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_harness_never_picks_code_by_backend_name(path: Path) -> None:
    text = path.read_text()
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1)
            if any(b in line for b in BY_NAME)]
    assert not hits, f"{path.relative_to(ROOT)} picks code by a backend's name: {hits}"
