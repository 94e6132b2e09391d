"""The one exception fljax raises for bad input, so the CLI can report it in one line."""


class FljaxError(ValueError):
    """A bad value, name, file or dataset, with a one-line message naming it and what is allowed.

    The CLI prints ``error: <message>`` and exits with code 2; library callers get a ValueError.
    """
