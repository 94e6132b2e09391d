"""The package's layers: imports point one way (down), and no module-level import circle.

The layers, lowest first, are stated in each subpackage's docstring; this test is their
definition. A module may import its own package and any lower layer, never a higher one nor a
sibling of its own layer (function-level imports included: a lazy import is still a dependency).
"""

import ast
import pathlib

import fljax

PACKAGE = pathlib.Path(fljax.__file__).parent

LAYERS = [
    {"fljax.errors"},
    {"fljax.hyperparams", "fljax.registry", "fljax.fielddocs", "fljax.accounting", "fljax.privacy"},
    {"fljax.data"},
    {"fljax.models"},
    {"fljax.compression", "fljax.robustness", "fljax.population"},
    {"fljax.algorithms"},
    {"fljax.probes"},
    {"fljax.core"},
    {"fljax.runner"},
    {"fljax", "fljax.__main__"},
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def unit(module: str) -> str:
    """The layer unit of a module: its first-level subpackage or top-level module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def imports(name: str, path: pathlib.Path, module_level_only: bool) -> set[str]:
    """The fljax modules ``name`` imports (``from fljax import x`` names module x if it is one)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    nodes = tree.body if module_level_only else ast.walk(tree)
    known = modules()
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            subs = [f"{base}.{alias.name}" for alias in node.names]
            found |= {s for s in subs if s in known} or {base}
            if not any(s in known for s in subs):
                found.add(base)
    return {m for m in found if m == "fljax" or m.startswith("fljax.")}


def test_every_module_is_in_a_layer():
    assert {unit(name) for name in modules()} <= set(RANK), sorted(
        {unit(name) for name in modules()} - set(RANK))


def test_imports_point_down():
    wrong = []
    for name, path in modules().items():
        source = unit(name)
        for target in imports(name, path, module_level_only=False):
            if unit(target) == source:
                continue
            if RANK[unit(target)] >= RANK[source]:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_level_import_circle():
    known = modules()
    graph = {name: {t for t in imports(name, path, module_level_only=True) if t in known}
             for name, path in known.items()}
    state: dict[str, int] = {}   # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(path + [node, nxt]))
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_top_level_holds_few_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top


# The public names as they were before the package was laid out in layers: ``fljax.X`` must keep
# meaning what it meant (the algorithms and wrappers are pinned by test_public_api).
PUBLIC_NAMES = {
    "Algorithm", "ClientContext", "Experiment", "ExperimentConfig", "FederatedData", "FljaxError",
    "LocalSGD", "Model", "RoundFunction", "RoundState", "build", "declare", "federate",
    "from_module", "grid_table", "init_state", "load_config", "load_dataset", "local_sgd",
    "make_evaluator", "make_model", "make_round", "mixture", "probes", "register_algorithm",
    "register_dataset", "register_model", "register_probe", "results_table", "run", "run_grid",
    "run_many", "sample_cohort", "unregister",
}
MODULE_ATTRIBUTES = {   # fljax.X -> the module it names
    "accounting": "fljax.accounting", "algorithms": "fljax.algorithms", "data": "fljax.data",
    "experiment": "fljax.runner.experiment", "hyperparams": "fljax.hyperparams",
    "models": "fljax.models", "privacy": "fljax.privacy", "probes": "fljax.probes",
    "registry": "fljax.registry", "runs": "fljax.core.runs", "sweep": "fljax.runner.sweep",
    "train": "fljax.runner.train",
}


def test_public_names_are_pinned():
    assert PUBLIC_NAMES <= set(fljax.__all__)
    assert set(fljax.__all__) - PUBLIC_NAMES == set(fljax.ALGORITHM_NAMES) | set(
        fljax.WRAPPER_NAMES)
    for name in PUBLIC_NAMES:
        assert getattr(fljax, name) is not None
    for name, module in MODULE_ATTRIBUTES.items():
        assert getattr(fljax, name).__name__ == module, name
