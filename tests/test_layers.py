"""The layers point one way: tuner <- knobs <- targets <- runner <- server.

Walks every module's imports (statically, with ``ast``) and checks each package imports only
from the layers below it; ``tuner`` also never touches grpc or sqlite, so the optimizer can
be used without the service.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["tuner", "knobs", "targets", "runner", "server"]
FORBIDDEN_EXTERNAL = {"tuner": {"grpc", "sqlite3", "sqlite_utils", "google"}}


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def modules(package: str) -> list[Path]:
    """The package's own modules: not those of a virtual environment kept inside it."""
    found = (ROOT / package).rglob("*.py")
    return sorted(p for p in found if not any(part.startswith(".") for part in p.parts))


@pytest.mark.parametrize("package", LAYERS)
def test_package_imports_only_lower_layers(package: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    higher = set(LAYERS) - allowed
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) & higher)
        for path in modules(package)
        if imported_top_levels(path) & higher
    }
    assert not offenders, f"{package} imports a higher layer: {offenders}"


def test_optimizer_never_imports_grpc_or_sqlite() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) & FORBIDDEN_EXTERNAL["tuner"])
        for path in modules("tuner")
        if imported_top_levels(path) & FORBIDDEN_EXTERNAL["tuner"]
    }
    assert not offenders, offenders


def test_only_the_cli_entry_point_is_outside_server() -> None:
    """Nothing but server itself imports server (bench and examples included)."""
    outside = [
        p for d in ("tuner", "knobs", "targets", "runner", "bench", "examples") for p in modules(d)
    ]
    offenders = [str(p.relative_to(ROOT)) for p in outside if "server" in imported_top_levels(p)]
    assert not offenders, offenders


def test_the_walker_sees_imports(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import server.app\nfrom targets.base import Target\nfrom . import x\n")
    assert imported_top_levels(sample) == {"server", "targets"}


def _designer_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("tuner.designer."):
                out.add(node.module.split(".")[2])
            elif node.module == "tuner.designer":
                out.add("__init__")
    return out


def test_the_designer_package_depends_one_way() -> None:
    """No import cycle among ``tuner/designer``'s modules (the package's ``__init__`` only
    re-exports, and no module imports it)."""
    folder = ROOT / "tuner" / "designer"
    graph = {p.stem: _designer_imports(p) for p in folder.glob("*.py")}
    assert all("__init__" not in deps for name, deps in graph.items() if name != "__init__")
    graph.pop("__init__")
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        if name in done or name not in graph:
            return
        for dep in sorted(graph[name]):
            visit(dep, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
