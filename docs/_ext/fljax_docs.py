"""What the API reference needs from Sphinx, on top of autodoc, autosummary and napoleon.

1. Docstrings written as plain text. Many of fljax's docstrings are plain text whose equations are
   indented lines (``Delta_i = w^t - y_i,K``), which reStructuredText reads as errors ("Unexpected
   indentation"). Each docstring is first parsed on its own by plain docutils: one that parses
   cleanly renders as reStructuredText; in one that does not, each paragraph that does not parse
   cleanly alone is shown verbatim (a literal block), as the docstring's author wrote it.
2. Names documented under another name. A type hint names a class where it is defined
   (``fljax.algorithms.base.Algorithm``); the reference documents it where users import it
   (``fljax.Algorithm``). A reference that does not resolve and names an object of fljax is sent
   to a documented name of the same object; a bare name is first qualified by the module it is
   written in. References to anything not documented still fail.
3. One canonical name per class: a class exported twice (``fljax.Algorithm`` and
   ``fljax.algorithms.Algorithm``) takes its canonical name from its preferred documentation only.
4. Quiet trial parses: autosummary's summary lines and sphinx-autodoc-typehints parse docstrings
   once more on the side; their reports would reach stderr outside the build's warnings.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import io
import re
import sys

from docutils.core import publish_doctree
from docutils.parsers.rst import directives, roles

# The unpatched docutils lookups, taken before Sphinx patches them while it reads a document.
_DIRECTIVE = directives.directive
_ROLE = roles.role
# Messages of a trial parse that the real build resolves: Sphinx's own roles and directives.
_BENIGN = ("Unknown interpreted text role", "No role entry", "Unknown directive type",
           "No directive entry", 'Trying "')


def _parses_cleanly(text: str) -> bool:
    """Whether plain docutils reads ``text`` without a warning (Sphinx's roles and directives
    excepted)."""
    saved = directives.directive, roles.role, dict(directives._directives), dict(roles._roles)
    directives.directive, roles.role = _DIRECTIVE, _ROLE
    directives._directives.clear()
    roles._roles.clear()
    stream = io.StringIO()
    try:
        doctree = publish_doctree(text, settings_overrides={
            "report_level": 2, "halt_level": 5, "warning_stream": stream,
            "file_insertion_enabled": False, "raw_enabled": False})
    except Exception:                       # noqa: BLE001 (any failure: show it verbatim)
        return False
    finally:
        directives.directive, roles.role = saved[0], saved[1]
        directives._directives.clear()
        directives._directives.update(saved[2])
        roles._roles.clear()
        roles._roles.update(saved[3])
    del doctree
    for line in stream.getvalue().splitlines():
        if re.match(r".*\((WARNING|ERROR|SEVERE)/\d\)", line) and not any(
                b in line for b in _BENIGN):
            return False
    return True


def _verbatim(lines: list[str]) -> list[str]:
    return ["::", "", *("    " + line if line.strip() else "" for line in lines), ""]


def _paragraphs(lines: list[str]) -> list[list[str]]:
    blocks, block = [], []
    for line in lines:
        if line.strip():
            block.append(line)
        elif block:
            blocks.append(block)
            block = []
    if block:
        blocks.append(block)
    return blocks


def plain_text_docstrings(app, what, name, obj, options, lines: list[str]) -> None:
    if not lines or _parses_cleanly("\n".join(lines)):
        return
    out: list[str] = []
    blocks = _paragraphs(lines)
    for i, block in enumerate(blocks):
        # A paragraph ending with '::' introduces the next one: keep the pair together.
        if block[-1].rstrip().endswith("::") and i + 1 < len(blocks):
            blocks[i + 1] = block + [""] + blocks[i + 1]
            continue
        text = "\n".join(line[min(len(l) - len(l.lstrip()) for l in block):] for line in block)
        out += (block + [""]) if _parses_cleanly(text) and not block[0].startswith(" ") \
            else _verbatim(block)
    lines[:] = out


_documented: dict[int, list[str]] = {}


def _lookup(name: str):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except Exception:                   # noqa: BLE001
            continue
        try:
            for attribute in parts[cut:]:
                value = getattr(value, attribute)
        except AttributeError:
            return None
        return value
    return None


def _aliases(env) -> dict[int, list[str]]:
    if not _documented:
        for name, entry in env.domains["py"].objects.items():
            if not name.startswith("fljax") or entry.aliased:
                continue
            value = _lookup(name)
            if value is not None and not isinstance(value, (int, float, str, bool, tuple)):
                _documented.setdefault(id(value), []).append(name)
        for names in _documented.values():
            names.sort(key=lambda n: (n.count("."), n))
    return _documented


def _candidates(node) -> list[str]:
    """Where a reference may point: its target as written, or a bare name in the module it is
    written in (the page's module, or the module whose docstring it sits in: the docstring of
    ``fljax.data.loaders.load_dataset`` names ``load_npz`` of ``fljax.data.loaders``)."""
    target = node.get("reftarget", "").lstrip(".~")
    if target.startswith("fljax"):
        return [target]
    modules = [node.get("py:module")]
    source = str(node.source or "")
    if "docstring of " in source:
        parts = source.rsplit("docstring of ", 1)[1].split(".")
        modules += [".".join(parts[:cut]) for cut in range(len(parts) - 1, 0, -1)]
    return [f"{m}.{target}" for m in modules if m and m.startswith("fljax")]


def documented_alias(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    domain = env.domains["py"]
    for candidate in _candidates(node):
        value = _lookup(candidate)
        if value is None:
            continue
        names = _aliases(env).get(id(value))
        if names:
            return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                       names[0], node, contnode)
    return None


def qualify_bare_names(app, doctree) -> None:
    """A bare name in a signature (``ctx: ClientContext`` of a NamedTuple's fields) is searched
    everywhere, and ``ClientContext`` is documented under several names: it is qualified by the
    module of the page, or else by the module the documented object is defined in (where its
    annotations were written); ``documented_alias`` then finds its documentation. A name of
    another package gets its full name (``jax._src.mesh.Mesh``)."""
    from sphinx import addnodes

    for node in doctree.findall(addnodes.pending_xref):
        target = node.get("reftarget", "")
        if node.get("refdomain") != "py" or "." in target or not target:
            continue
        modules = [node.get("py:module") or ""]
        signature = node.parent
        while signature is not None and not isinstance(signature, addnodes.desc_signature):
            signature = signature.parent
        if signature is not None and signature.get("module") and signature.get("fullname"):
            value = _lookup(f"{signature['module']}.{signature['fullname']}")
            modules.append(getattr(value, "__module__", None) or "")
        for module in modules:
            value = _lookup(f"{module}.{target}") if module.startswith("fljax") else None
            if not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            home = getattr(value, "__module__", "") or ""
            # fljax's own: by the module it is named in; another package's (jax's ``Mesh``): by
            # its full name, which nitpick_ignore_regex lets pass.
            node["reftarget"] = f"{module}.{target}" if home.startswith("fljax") else \
                f"{home}.{value.__qualname__}"
            break


def _preferred_names() -> dict[str, str]:
    """Each public class's preferred documented name, by its canonical name: ``fljax.X`` where
    the package exports it, else the first package of the reference (``generate.PACKAGES``)
    that lists it."""
    import generate

    preferred: dict[str, str] = {}
    for package_name in generate.PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except ModuleNotFoundError:
            continue
        for name in generate.public_names(package):
            value = getattr(package, name, None)
            if isinstance(value, type):
                canonical = f"{value.__module__}.{value.__qualname__}"
                preferred.setdefault(canonical, f"{package_name}.{name}")
    return preferred


def _one_canonical_name() -> None:
    """A class exported twice (``fljax.Algorithm``, ``fljax.algorithms.Algorithm``) gets its
    canonical name (``fljax.algorithms.base.Algorithm``, where type hints point) from its
    preferred documentation only: two would be a duplicate description."""
    from sphinx.ext.autodoc._property_types import _ClassDefProperties

    original = _ClassDefProperties.canonical_full_name.fget
    preferred: dict[str, str] = {}

    def canonical_full_name(self):
        if not preferred:
            preferred.update(_preferred_names())
        canonical = original(self)
        if canonical and self.full_name != preferred.get(canonical, self.full_name):
            return None
        return canonical

    _ClassDefProperties.canonical_full_name = property(canonical_full_name)


def _napoleon_skips_attributes(app) -> None:
    """Napoleon reads an attribute's or property's docstring ``"x: y"`` as a type ``x``; fljax's
    say ``"Delta_i = w^t - y_i,K: the client's update"``. Napoleon runs on the others."""
    for listener in list(app.events.listeners["autodoc-process-docstring"]):
        if getattr(listener.handler, "__module__", "").startswith("sphinx.ext.napoleon"):
            app.disconnect(listener.id)
            handler = listener.handler

            def napoleon(app, what, name, obj, options, lines, handler=handler):
                if what not in ("attribute", "property", "data"):
                    handler(app, what, name, obj, options, lines)

            app.connect("autodoc-process-docstring", napoleon, priority=listener.priority)


def _whole_literals_in_summaries() -> None:
    """autosummary's one-line summary is the docstring's first sentence; one that ends inside an
    inline literal (``fljax plot RUN_DIR. ...``) is cut before that literal."""
    from sphinx.ext import autosummary

    original = autosummary.extract_summary

    def extract_summary(doc, settings):
        quiet = copy.copy(settings)          # its trial parse reports nothing (the build does)
        quiet.report_level = 5
        summary = original(doc, quiet)
        if summary.count("``") % 2:
            summary = summary[:summary.rindex("``")].rstrip(" ,;:(") + " ..."
        return summary

    autosummary.extract_summary = extract_summary
    from sphinx.ext.autosummary import generate

    if getattr(generate, "extract_summary", None) is original:
        generate.extract_summary = extract_summary


def _quiet_typehints_trial_parse() -> None:
    """sphinx-autodoc-typehints parses each docstring once more, with docutils' default settings,
    only to find where to insert the types; its reports went to stderr, outside the build's
    warnings (which still see every docstring through autodoc)."""
    import sphinx_autodoc_typehints as typehints

    original = typehints.parse

    def parse(text, settings):
        if getattr(settings, "warning_stream", None) in (None, sys.stderr):
            settings = copy.copy(settings)
            settings.report_level = 5
        return original(text, settings)

    typehints.parse = parse


def setup(app):
    _whole_literals_in_summaries()
    _quiet_typehints_trial_parse()
    app.setup_extension("sphinx.ext.napoleon")
    _napoleon_skips_attributes(app)
    _one_canonical_name()
    app.connect("autodoc-process-docstring", plain_text_docstrings, priority=900)
    app.connect("missing-reference", documented_alias)
    app.connect("doctree-read", qualify_bare_names)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
