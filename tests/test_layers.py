"""The layers point one way: tuner <- knobs <- targets <- runner <- cli, with the service
(``server``) beside them above ``tuner`` only.

Walks every module's imports (statically, with ``ast``) and checks each package imports only
from the layers it may: the service (API, storage, suggestion workers) never sits above
adapters it does not use, so ``server`` imports ``tuner`` alone; ``runner`` (sessions, the
daemon, configs, sweeps, Ray) reaches a server only through its client (``server.client``);
``cli`` may use everything. ``tuner`` also never touches grpc or sqlite, so the optimizer
can be used without the service.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.study import StudySpec

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["tuner", "knobs", "targets", "runner", "cli"]
#: What each package may import from this project (itself included).
ALLOWED = {
    **{name: set(LAYERS[: LAYERS.index(name) + 1]) for name in LAYERS},
    "server": {"tuner", "server"},
}
ALLOWED["runner"].add("server")  # through server.client only (checked below)
ALLOWED["cli"].add("server")
PACKAGES = set(ALLOWED)
FORBIDDEN_EXTERNAL = {"tuner": {"grpc", "sqlite3", "sqlite_utils", "google"}}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, by its full dotted name (``server.client``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def imported_top_levels(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(path)}


def modules(package: str) -> list[Path]:
    """The package's own modules: not those of a virtual environment kept inside it."""
    found = (ROOT / package).rglob("*.py")
    return sorted(p for p in found if not any(part.startswith(".") for part in p.parts))


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_imports_only_what_its_layer_may(package: str) -> None:
    forbidden = PACKAGES - ALLOWED[package]
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) & forbidden)
        for path in modules(package)
        if imported_top_levels(path) & forbidden
    }
    assert not offenders, f"{package} imports a layer it may not: {offenders}"


def test_the_service_imports_no_adapter_session_or_cli() -> None:
    """``server`` (service, storage, gRPC, security, observability) stands on ``tuner``."""
    offenders = {
        str(p.relative_to(ROOT)): sorted((imported_top_levels(p) & PACKAGES) - {"tuner", "server"})
        for p in modules("server")
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_runner_reaches_a_server_only_through_its_client() -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(
            m for m in imported_modules(p) if m.split(".")[0] == "server" and m != "server.client"
        )
        for p in modules("runner")
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_optimizer_never_imports_grpc_or_sqlite() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) & FORBIDDEN_EXTERNAL["tuner"])
        for path in modules("tuner")
        if imported_top_levels(path) & FORBIDDEN_EXTERNAL["tuner"]
    }
    assert not offenders, offenders


def test_benchmarks_and_examples_use_neither_the_service_nor_the_cli() -> None:
    """bench/ and examples/ drive the optimizer, the targets and the runner directly (a
    benchmark of the service talks to it over the wire, as any client would)."""
    outside = [p for d in ("bench", "examples") for p in modules(d)]
    offenders = [
        str(p.relative_to(ROOT)) for p in outside if imported_top_levels(p) & {"server", "cli"}
    ]
    assert not offenders, offenders


def test_the_walker_sees_imports(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import server.app\nfrom targets.base import Target\nfrom . import x\n")
    assert imported_top_levels(sample) == {"server", "targets"}


#: Calls that ask for a suggestion, and calls that complete a trial (Python API and gRPC).
SUGGESTS = {"suggest_trials", "propose", "SuggestTrials"}
COMPLETES = {"complete_trial", "CompleteTrial"}
#: The one trial loop, and the loops allowed beside it, each with its reason.
LOOP = "runner/loop.py"
LOOPS_ALLOWED = {
    # a load generator's workers are the server's remote clients: each call is timed
    "bench/load.py": "gRPC clients of the server under test",
    # a peer's own optimizer loop (Ax's Client.complete_trial), not ours
    "bench/peers/ax.py": "Ax's API",
}


def suggest_complete_loops(path: Path) -> list[int]:
    """The lines of loops in ``path`` whose body both asks for a suggestion and completes a
    trial, directly or through a function of the same module that completes one."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    completes = set(COMPLETES)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and _calls(node) & COMPLETES:
            completes.add(node.name)
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.For | ast.While | ast.AsyncFor)
        and _calls(node) & SUGGESTS
        and _calls(node) & completes
    ]


def _calls(node: ast.AST) -> set[str]:
    """The names of the functions and methods called anywhere inside ``node``."""
    out = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            func = inner.func
            if isinstance(func, ast.Attribute):
                out.add(func.attr)
            elif isinstance(func, ast.Name):
                out.add(func.id)
    return out


def test_outside_the_server_one_loop_suggests_and_completes() -> None:
    """Sessions, the daemon, the benchmarks and the tests' studies all run trials through
    ``runner.loop.run_loop``; ask/tell scripts and the Ray callbacks own their loops and
    make one call a step, so they hold none."""
    packages = ["tuner", "knobs", "targets", "runner", "cli", "bench", "examples"]
    found = {
        str(p.relative_to(ROOT)): lines
        for package in packages
        for p in modules(package)
        if (lines := suggest_complete_loops(p))
    }
    assert LOOP in found, "the walker no longer sees the one loop"
    others = {k: v for k, v in found.items() if k != LOOP and k not in LOOPS_ALLOWED}
    assert not others, f"a second suggest-to-complete loop (use runner.loop.run_loop): {others}"


def test_the_loop_rule_sees_a_loop_through_a_helper(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text(
        "def finish(api, t):\n    api.complete_trial('s', t.id)\n\n"
        "def run(api):\n    while True:\n        [t] = api.suggest_trials('s', 1)\n"
        "        finish(api, t)\n\n"
        "def ask(api):\n    return api.suggest_trials('s', 1)\n"
    )
    assert suggest_complete_loops(sample) == [5]


#: ``tuner/designer``'s parts, lowest first: a module imports only from its own part and
#: those before it. The contract (``base``), the numerical fast paths, the models, sampling
#: without a model, the acquisition, the decision table, the steps that execute it, and the
#: factory that picks a designer; the package's ``__init__`` only re-exports.
DESIGNER_PARTS = [
    "base",
    "fast",
    "models",
    "sampling",
    "acquisition",
    "strategy",
    "steps",
    "factory",
]
DESIGNER = ROOT / "tuner" / "designer"


def _designer_imports(path: Path) -> set[str]:
    """The ``tuner.designer`` modules ``path`` imports, dotted (``tuner.designer`` itself for
    an import of the package)."""
    return {
        name
        for name in imported_modules(path)
        if name == "tuner.designer" or name.startswith("tuner.designer.")
    }


def _designer_module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _designer_part(module: str) -> str:
    """``tuner.designer.models.model`` -> ``models``; ``tuner.designer`` -> ``__init__``."""
    rest = module.split(".")[2:]
    return rest[0] if rest else "__init__"


def test_the_designer_package_depends_one_way() -> None:
    """Each part imports only from itself and the parts below it (``DESIGNER_PARTS``), no
    module imports the package's ``__init__``, and no import cycle runs inside a part."""
    files = sorted(DESIGNER.rglob("*.py"))
    graph = {_designer_module(p): _designer_imports(p) for p in files}
    parts = {_designer_part(m) for m in graph} - {"__init__"}
    assert parts == set(DESIGNER_PARTS), f"a part not in DESIGNER_PARTS: {parts}"
    upward = {}
    for module, deps in graph.items():
        part = _designer_part(module)
        if part == "__init__":
            continue
        rank = DESIGNER_PARTS.index(part)
        bad = sorted(
            d
            for d in deps
            if _designer_part(d) == "__init__" or DESIGNER_PARTS.index(_designer_part(d)) > rank
        )
        if bad:
            upward[module] = bad
    assert not upward, f"designer modules importing a part above their own: {upward}"
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        if name in done or name not in graph:
            return
        for dep in sorted(graph[name]):
            if _designer_part(dep) == _designer_part(name):
                visit(dep, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())


def test_the_designer_rule_sees_an_upward_import(tmp_path: Path) -> None:
    sample = tmp_path / "tuner" / "designer" / "models" / "x.py"
    sample.parent.mkdir(parents=True)
    sample.write_text("def f():\n    from tuner.designer.steps.bo import BODesigner\n")
    assert _designer_imports(sample) == {"tuner.designer.steps.bo"}
    assert _designer_part("tuner.designer.steps.bo") == "steps"
    assert DESIGNER_PARTS.index("steps") > DESIGNER_PARTS.index("models")


# -- what a light command loads -----------------------------------------------------------
HEAVY = ("torch", "botorch", "gpytorch", "matplotlib", "scipy.stats", "sqlite_utils", "pandas")


def loaded_heavy(code: str) -> list[str]:
    """The heavy modules a fresh interpreter has loaded after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_client_loads_no_designer_and_no_plotting() -> None:
    assert loaded_heavy("import server.client") == []


def test_reading_commands_load_no_designer_and_no_plotting(tmp_path: Path) -> None:
    """``tuner --help``, ``studies`` and ``show`` start without torch or matplotlib; what
    they cost is measured in ``bench.startup``."""
    db = tmp_path / "t.db"
    with SQLiteStorage(db) as storage:
        service = TuningService(storage)
        service.create_study(
            StudySpec.from_dict(
                {
                    "name": "s",
                    "knobs": [{"name": "x", "kind": "float", "low": 0.0, "high": 1.0}],
                    "objectives": [{"name": "y"}],
                    "designer": {"algorithm": "sobol"},
                }
            )
        )
        (trial,) = service.suggest_trials("s", 1)
        service.complete_trial("s", trial.id, {"y": 1.0})
    for argv in (["--help"], ["studies", "--db", str(db)], ["show", "s", "--db", str(db)]):
        code = (
            "import contextlib, io\nfrom cli.main import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    assert main({argv!r}) == 0"
        )
        assert loaded_heavy(code) == [], argv
