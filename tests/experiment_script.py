"""Import a script of experiments/ (not a package) as a module, for the tests that check it."""
import importlib.util
import pathlib

EXPERIMENTS = pathlib.Path(__file__).parents[1] / "experiments"


def load(name: str):
    """The module experiments/NAME.py, executed once per call."""
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
