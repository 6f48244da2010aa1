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
