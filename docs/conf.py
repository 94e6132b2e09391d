"""Sphinx configuration of fljax's documentation.

Build (offline, nitpicky, warnings as errors)::

    python -m sphinx -W -n -b html docs docs/_build/html

Before the build, ``docs/generate.py`` writes the pages that follow the code: one page per
algorithm and wrapper (``docs/algorithms/``), the API reference pages (``docs/api/``) and copies
of the notebooks (``docs/notebooks/*.ipynb``); all of them are ignored by git.
"""

from __future__ import annotations

import builtins
import importlib
import os
import sys
import warnings

# sphinx-autodoc-typehints 3.6 calls an API Sphinx 10 removes: not ours to fix, not a build warning.
warnings.filterwarnings("ignore", message=".*set_application.*is deprecated")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import generate  # noqa: E402  (docs/generate.py)

generate.main()

project = "fljax"
author = "the fljax authors"
copyright = "the fljax authors"
release = importlib.import_module("fljax").__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx_autodoc_typehints",
    "sphinx.ext.mathjax",
]

root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "algorithms/_summary.md"]
templates_path = ["_templates"]

# Markdown and notebooks: notebooks render with the outputs they store, nothing is executed.
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# API reference from the docstrings.
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"member-order": "bysource"}
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
typehints_fully_qualified = False
always_document_param_types = False
typehints_document_rtype = True

# Offline: no intersphinx, no remote assets. MathJax is Sphinx's default CDN script, loaded by the
# reader's browser; the build itself fetches nothing.
html_theme = "sphinx_book_theme"
html_title = "fljax"
# The sidebar shows the open section only: the API reference has hundreds of pages, and a full
# navigation tree on every page is most of the build's time.
html_theme_options = {"show_toc_level": 2, "use_download_button": False,
                      "use_fullscreen_button": False, "collapse_navbar": True,
                      "max_navbar_depth": 2}
html_static_path: list[str] = []

# Nitpicky: every reference to fljax must resolve. Only names of other packages (which have no
# inventory here: no network at build time), Python's builtins and typing internals are exempt.
_EXTERNAL = r"(jax|jaxlib|jnp|np|numpy|optax|flax|nn|chex|orbax|ocp|typing|typing_extensions|" \
            r"collections|collections\.abc|types|enum|dataclasses|pathlib|os|argparse|io|" \
            r"concurrent|threading|tqdm|tensorboardX|dp_accounting|optuna|scipy|sklearn|" \
            r"matplotlib|tensorflow_datasets|tfds|mnist1d|array_record|abc|functools|inspect|" \
            r"numbers|re|json|logging|contextlib|subprocess|signal)"
nitpick_ignore_regex = [
    ("py:.*", _EXTERNAL + r"(\..*)?"),
    ("py:.*", r"(Array|ArrayLike|PyTree|Params|PRNGKey|Key|Shape|DType|Dtype|Callable|Any|"
              r"Optional|Union|Sequence|Mapping|Iterable|Iterator|Literal|NamedTuple|TypeVar|"
              r"Self|NoneType|ellipsis|EllipsisType)"),
    ("py:.*", "|".join(name for name in dir(builtins) if not name.startswith("_"))),
]

sys.path.insert(0, os.path.join(HERE, "_ext"))
extensions.append("fljax_docs")
