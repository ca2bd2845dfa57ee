"""The package's modules import each other without a circle, and in layers that read top to
bottom: data -> partition -> client setting -> client data -> method -> training loop ->
aggregation -> run (:data:`LAYERS`), each module importing only its own layer and those below,
but for the listed, justified :data:`EXCEPTIONS`. The run configuration
(:mod:`fedul_flwr.config`) sits below the registries of methods, strategies and client
settings, which import it, and the checks that need both live above them
(:mod:`fedul_flwr.preflight`). Imports under ``if TYPE_CHECKING:`` (type hints only, never run)
do not count; a function-level (deferred) import counts as any other, and carries a
``# deferred:`` comment naming the optional dependency, the import cost or the cycle that needs
it."""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fedul_flwr"


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


LAYERS: tuple[tuple[str, int], ...] = (
    # 0 foundation: no concept of the method; every layer may use it
    ("fedul_flwr", 0), ("fedul_flwr.registry", 0), ("fedul_flwr.wire", 0), ("fedul_flwr.console", 0),
    ("fedul_flwr.markup", 0), ("fedul_flwr.store", 0), ("fedul_flwr.rng", 0), ("fedul_flwr.config", 0),
    ("fedul_flwr.config.*", 0),
    # 1 data: what a dataset is, its sources and registry
    ("fedul_flwr.data", 1), ("fedul_flwr.data.image_dataset", 1), ("fedul_flwr.data.images", 1),
    ("fedul_flwr.data.torchvision_datasets", 1), ("fedul_flwr.data.mnist_sample", 1), ("fedul_flwr.data.datasets", 1),
    ("fedul_flwr.data.user_datasets", 1), ("fedul_flwr.data.synthetic", 1),
    # 2 partition: a dataset cut into clients, U sets, priors, labels per client
    ("fedul_flwr.data.partition", 2), ("fedul_flwr.data.usets", 2), ("fedul_flwr.data.prior_noise", 2),
    ("fedul_flwr.data.labels_at_clients", 2), ("fedul_flwr.data.labels_at_server", 2), ("fedul_flwr.data.annotation", 2), ("fedul_flwr.data.pu", 2),
    # 3 client setting: the parts a client holds (ClientData) and the settings that build them in simulation
    ("fedul_flwr.data.client_data", 3), ("fedul_flwr.data.simulated", 3),
    # 4 client data: where one client's data comes from (a simulated setting or its node's folder)
    ("fedul_flwr.data.sources", 4), ("fedul_flwr.data.node_folder", 4), ("fedul_flwr.data.node_folder.*", 4),
    # 5 method: the methods, their models and augmentations
    ("fedul_flwr.methods", 5), ("fedul_flwr.methods.*", 5), ("fedul_flwr.models", 5), ("fedul_flwr.augment", 5),
    # 6 training loop: the one local loop, its evaluation, how it executes, the strategies' client-side work
    ("fedul_flwr.training", 6), ("fedul_flwr.evaluation", 6), ("fedul_flwr.cohort", 6), ("fedul_flwr.acceleration", 6),
    ("fedul_flwr.execution", 6), ("fedul_flwr.optimizer_state", 6), ("fedul_flwr.strategy_hooks", 6),
    # 7 aggregation: the server's strategies, differential privacy, the EMA of the global weights
    ("fedul_flwr.strategies", 7), ("fedul_flwr.strategies.*", 7), ("fedul_flwr.privacy", 7),
    ("fedul_flwr.privacy.*", 7), ("fedul_flwr.ema", 7),
    # 8 run: the apps, the checks before round 1, the outputs, the commands and the grids
    ("fedul_flwr.client_app", 8), ("fedul_flwr.server_app", 8), ("fedul_flwr.inprocess", 8), ("fedul_flwr.outputs", 8),
    ("fedul_flwr.checkpoint", 8), ("fedul_flwr.preflight", 8), ("fedul_flwr.resume", 8), ("fedul_flwr.check_cli", 8),
    ("fedul_flwr.node_data_cli", 8), ("fedul_flwr.cli", 8), ("fedul_flwr.experiments", 8), ("fedul_flwr.experiments.*", 8),
)  # fmt: skip
"""Module-name pattern (:mod:`fnmatch`) -> layer, the first match wins: 0 foundation, 1 data,
2 partition, 3 client setting, 4 client data, 5 method, 6 training loop, 7 aggregation, 8 run."""

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("fedul_flwr.data.user_datasets", "fedul_flwr.data.partition"):
        "an hf: dataset without a test split is cut by the project's one seeded holdout split (holdout_split)",
    ("fedul_flwr.methods.base", "fedul_flwr.strategies.per_model"):
        "a method declares how the server aggregates its models (ModelSpec.aggregation: PerModelAggregation)",
    ("fedul_flwr.methods.feddb", "fedul_flwr.strategies.dma"):
        "FedDB declares its server-side debiased model aggregation (DMA), part of the method",
    ("fedul_flwr.methods.feddb.settings", "fedul_flwr.strategies.dma"):
        "FedDB's keys declare the DMA's losses as the choices of dma-loss (DMA_LOSSES)",
    ("fedul_flwr.methods.fedmatch.helpers", "fedul_flwr.strategies.per_model"):
        "FedMatch's server side is a per-model aggregation mixin (sigma by n_L, psi by n_U, the helpers per client)",
    ("fedul_flwr.methods.fedmatch.helpers", "fedul_flwr.strategies.contract"):
        "FedMatch declares its aggregation contract (partial replies; each psi forwarded as a helper)",
    ("fedul_flwr.methods.fedmatch.helpers", "fedul_flwr.strategies.kept_state"):
        "FedMatch's server keeps each client's psi by node key and asks a resumed run's nodes theirs (ask_node_keys)",
    ("fedul_flwr.methods.fedrgd.grouping", "fedul_flwr.strategies.per_model"):
        "FedRGD's grouping-based averaging is a per-model aggregation mixin (it keeps the round's global arrays)",
    ("fedul_flwr.methods.fedrgd.grouping", "fedul_flwr.strategies.contract"):
        "FedRGD declares its aggregation contract (reweighted: group shares and the server's model)",
    ("fedul_flwr.methods.hassle", "fedul_flwr.strategies.per_model"):
        "HASSLE declares the per-model aggregation of its partial replies",
    ("fedul_flwr.methods.hassle", "fedul_flwr.strategies.contract"):
        "HASSLE declares its aggregation contract (partial replies, combining)",
    ("fedul_flwr.methods.rscfed.consensus", "fedul_flwr.strategies.contract"):
        "RSCFed declares its consensus aggregation's contract (reweighted; the robust strategies refused)",
    ("fedul_flwr.methods.hassle", "fedul_flwr.training"):
        "HASSLE's local update runs the one training loop (LocalLoop) once per model it trains",
    ("fedul_flwr.methods.hassle", "fedul_flwr.acceleration"):
        "HASSLE's per-model loops run with the plain execution (PLAIN) where a model is trained alone",
    ("fedul_flwr.methods.hassle", "fedul_flwr.strategy_hooks"):
        "HASSLE's local update adds FedProx's proximal term (ProximalTerm) of the strategies' client work",
}  # fmt: skip
"""(importer, imported) -> why a module imports one of a higher layer. The imported module
imports nothing of the importer's layer or above, so no circle follows."""

DEFERRED_CHECKED: tuple[str, ...] = ("fedul_flwr", "fedul_flwr.*")
"""Modules whose every deferred import carries a ``# deferred:`` comment: the whole package."""


def _layer(module: str) -> int:
    for pattern, layer in LAYERS:
        if fnmatch.fnmatchcase(module, pattern):
            return layer
    raise AssertionError(f"{module} matches no pattern of LAYERS: give it a layer")


def _typing_only(tree: ast.AST) -> set[int]:
    return {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }


def _uncommented_deferred_imports(path: Path) -> list[str]:
    """``line: import`` of each function-level import of ``path`` (outside ``if TYPE_CHECKING:``)
    without a ``# deferred:`` comment on its lines or on the line above."""
    source = path.read_text()
    lines, tree = source.splitlines(), ast.parse(source)
    top, typing_only = {id(node) for node in tree.body}, _typing_only(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in top or id(node) in typing_only:
            continue
        own = " ".join(lines[node.lineno - 1 : node.end_lineno])
        # the block right above: comment lines (one comment may span lines) and the imports the
        # same comment covers
        above, row = [], node.lineno - 2
        while row >= 0 and lines[row].strip().startswith(("#", "import ", "from ")):
            above.append(lines[row].strip())
            row -= 1
        if "# deferred:" not in own and not any(line.startswith("# deferred:") for line in above):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def _runtime_imports(path: Path, modules: set[str], root: Path = PACKAGE) -> set[str]:
    """The package modules ``path`` imports when it runs (at the top or inside a function)."""
    tree = ast.parse(path.read_text())
    typing_only = _typing_only(tree)
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            candidates = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {c for c in candidates if c in modules and c != name}
    return found


def _import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _runtime_imports(path, set(paths)) for name, path in paths.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_package() -> None:
    assert _cycles(_import_graph()) == []


def test_config_knows_no_registry_and_the_checks_sit_above_both() -> None:
    graph = _import_graph()
    registries = {"fedul_flwr.methods", "fedul_flwr.methods.base", "fedul_flwr.strategies", "fedul_flwr.data.simulated"}
    assert not graph["fedul_flwr.config"] & registries, graph["fedul_flwr.config"]
    assert {"fedul_flwr.config", "fedul_flwr.methods", "fedul_flwr.strategies"} <= graph["fedul_flwr.preflight"]
    assert "fedul_flwr.preflight" in graph["fedul_flwr.server_app"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) of each import of a module of a higher layer."""
    return {(a, b) for a, imported in graph.items() for b in imported if _layer(b) > _layer(a)}


def test_every_module_has_a_layer_and_imports_none_above_it() -> None:
    """No module imports (at the top or in a function) a module of a higher layer, but for
    :data:`EXCEPTIONS`; each exception is still needed (a stale one fails)."""
    upward = _upward_imports(_import_graph())
    assert upward - set(EXCEPTIONS) == set(), sorted(f"{a} ({_layer(a)}) -> {b} ({_layer(b)})" for a, b in upward - set(EXCEPTIONS))
    assert set(EXCEPTIONS) - upward == set(), "exceptions no module needs any more"


def test_the_layer_check_sees_a_deferred_upward_import(tmp_path: Path) -> None:
    """A function-level import of a higher layer counts, one of a lower layer does not."""
    module = tmp_path / "fedul_flwr" / "data" / "partition.py"
    module.parent.mkdir(parents=True)
    module.write_text("from fedul_flwr.rng import numpy_generator\n\n\ndef f():\n    from fedul_flwr.server_app import app\n")
    known = {"fedul_flwr.rng", "fedul_flwr.server_app", "fedul_flwr.data.partition"}
    imports = _runtime_imports(module, known, tmp_path / "fedul_flwr")
    assert imports == {"fedul_flwr.rng", "fedul_flwr.server_app"}
    assert _upward_imports({"fedul_flwr.data.partition": imports}) == {("fedul_flwr.data.partition", "fedul_flwr.server_app")}
    try:
        _layer("fedul_flwr.nowhere")
    except AssertionError as exc:
        assert "fedul_flwr.nowhere" in str(exc)
    else:
        raise AssertionError("a module without a layer passed")


def test_every_deferred_import_says_why(tmp_path: Path) -> None:
    """In the modules of :data:`DEFERRED_CHECKED` every function-level import names the optional
    dependency, the import cost or the import circle that keeps it out of the module's top."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in DEFERRED_CHECKED):
            if missing := _uncommented_deferred_imports(path):
                found[name] = missing
    assert found == {}, found
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\n\ndef f():\n    import json\n    # deferred: cycle a -> b -> a\n    import csv\n"
                     "    import re  # deferred: optional dependency re\n")  # fmt: skip
    assert _uncommented_deferred_imports(probe) == ["5: import json"]

