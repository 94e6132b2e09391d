"""The documentation builds offline, nitpicky, with warnings as errors, and covers the package.

One Sphinx build (module-scoped, in a subprocess, the command of ``docs/conf.py``) serves every
check: the build passes; every public name of ``fljax`` and of its public subpackages has an entry
in the API reference (read from the build's ``objects.inv``); every algorithm and wrapper has its
page. Network access is pointed at a closed port, so a build that fetched anything would fail.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
NEEDED = ("sphinx", "myst_nb", "myst_parser", "sphinx_book_theme", "sphinx_autodoc_typehints")
MISSING = [name for name in NEEDED if importlib.util.find_spec(name) is None]

pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"the documentation tools are not "
                                f"installed ({', '.join(MISSING)}): pip install -r requirements.txt")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    closed = "http://127.0.0.1:9"                        # offline: any fetch fails
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
           "HTTP_PROXY": closed, "HTTPS_PROXY": closed, "http_proxy": closed,
           "https_proxy": closed, "NO_PROXY": "", "no_proxy": ""}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-n", "-b", "html", "-q",
                           "-d", str(tmp_path_factory.mktemp("doctrees")), DOCS, str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    from sphinx.util.inventory import InventoryFile

    inventory = None
    if done.returncode == 0:
        with open(out / "objects.inv", "rb") as f:
            inventory = InventoryFile.loads(f.read(), uri="")
    return done, inventory, seconds


def names(inventory, domain_prefix: str) -> set[str]:
    return {name for kind in inventory.data if kind.startswith(domain_prefix)
            for name in inventory.data[kind]}


def test_the_docs_build_offline_nitpicky_with_warnings_as_errors(build):
    done, _, seconds = build
    assert done.returncode == 0, f"sphinx failed after {seconds:.0f} s:\n{done.stderr[-6000:]}"


def test_every_public_name_has_an_api_entry(build):
    done, inventory, _ = build
    assert done.returncode == 0, done.stderr[-3000:]
    spec = importlib.util.spec_from_file_location("docs_generate",
                                                  os.path.join(DOCS, "generate.py"))
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    documented = names(inventory, "py:")
    import fljax

    missing = [f"fljax.{name}" for name in fljax.__all__ if f"fljax.{name}" not in documented]
    packages = []
    for package_name in generate.PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except ModuleNotFoundError:
            continue
        packages.append(package_name)
        missing += [f"{package_name}.{name}" for name in generate.public_names(package)
                    if f"{package_name}.{name}" not in documented]
        missing += [module for module in generate.public_modules(package)
                    if module not in documented]
    assert {"fljax.algorithms", "fljax.data", "fljax.models", "fljax.probes",
            "fljax.compression"} <= set(packages)
    assert not missing, f"no API entry for {missing}"


def test_every_algorithm_and_wrapper_has_a_page(build):
    done, inventory, _ = build
    assert done.returncode == 0, done.stderr[-3000:]
    import fljax

    pages = names(inventory, "std:doc")
    every = [*fljax.ALGORITHM_NAMES, *fljax.WRAPPER_NAMES]
    assert {"local_layers", "switch", "fedavg", "dp"} <= set(every)
    assert [name for name in every if f"algorithms/{name}" not in pages] == []
