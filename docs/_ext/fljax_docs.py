"""Two things the API reference needs from Sphinx.

1. Docstrings written as plain text. Many of fljax's docstrings are plain text whose equations are
   indented lines (``Delta_i = w^t - y_i,K``), which reStructuredText reads as errors ("Unexpected
   indentation"). Each docstring is first parsed on its own by plain docutils: one that parses
   cleanly renders as reStructuredText; in one that does not, each paragraph that does not parse
   cleanly alone is shown verbatim (a literal block), as the docstring's author wrote it.
2. Names documented under another name. A type hint names a class where it is defined
   (``fljax.algorithms.base.Algorithm``); the reference documents it where users import it
   (``fljax.Algorithm``). A reference that does not resolve and names an object of fljax is sent
   to a documented name of the same object. References to anything not documented still fail.
"""

from __future__ import annotations

import importlib
import io

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
    for message in doctree.traverse(lambda n: n.tagname == "system_message"):
        if message["level"] >= 2 and not any(b in message.astext() for b in _BENIGN):
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


def documented_alias(app, env, node, contnode):
    if node.get("refdomain") != "py" or not node.get("reftarget", "").startswith("fljax"):
        return None
    value = _lookup(node["reftarget"])
    if value is None:
        return None
    names = _aliases(env).get(id(value))
    if not names:
        return None
    domain = env.domains["py"]
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], names[0], node,
                               contnode)


def setup(app):
    app.connect("autodoc-process-docstring", plain_text_docstrings, priority=900)
    app.connect("missing-reference", documented_alias)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
