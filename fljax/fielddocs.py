"""The meaning of every field where ``help()`` shows it, instead of in source comments."""

from __future__ import annotations

import dataclasses
import inspect
import textwrap


def document_fields(cls: type, texts: dict[str, str]) -> None:
    """Give each field of the NamedTuple ``cls`` its meaning, ``texts[field]``, as the docstring
    ``help(cls)`` shows (instead of 'Alias for field number N'); raise TypeError if a field has no
    text or a text names no field, so a new field cannot go undocumented."""
    missing = [name for name in cls._fields if name not in texts]
    unknown = [name for name in texts if name not in cls._fields]
    if missing or unknown:
        raise TypeError(f"{cls.__name__}: fields without a text {missing}, texts of no field "
                        f"{unknown}")
    for name, text in texts.items():
        getattr(cls, name).__doc__ = " ".join(text.split())


def list_fields(cls: type, help_key: str = "help") -> str:
    """``cls.__doc__`` (a dataclass's) followed by a list of its fields, each with the text in its
    ``metadata[help_key]``: ``help(cls)`` then gives every field's meaning."""
    items = [textwrap.fill(f"{field.name}: {field.metadata[help_key]}", 96,
                           subsequent_indent="    ", break_on_hyphens=False,
                           break_long_words=False)
             for field in dataclasses.fields(cls)]
    return f"{inspect.cleandoc(cls.__doc__ or '')}\n\nFields:\n\n" + "\n".join(items) + "\n"
