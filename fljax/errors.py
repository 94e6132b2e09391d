"""The one exception fljax raises for bad input, so the CLI can report it in one line."""

import contextlib
import os
import re


class FljaxError(ValueError):
    """A bad value, name, file or dataset, with a one-line message naming it and what is allowed.

    The CLI prints ``error: <message>`` and exits with code 2; library callers get a ValueError.
    """


RESUME = "nothing written before is lost: run the same command again to resume"
SPACE = "nothing written before is lost: free space and run the same command again to resume"
# What a run refused in a directory that holds another run can do instead.
NEW_RUN = ("use --out-dir NEW for a new run in a new directory, or --fresh to delete this "
           "directory's checkpoints and logs (metrics.jsonl, tb/, config.json) and start over")


def os_reason(error: BaseException) -> str | None:
    """The operating system's words for why a write failed (an OSError's, or the errno a
    library's message carries, as TensorStore's ``[os_error_code='28']``); None if it is no
    operating-system error."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    code = re.search(r"os_error_code='(\d+)'", str(error))
    return os.strerror(int(code.group(1))) if code else None


@contextlib.contextmanager
def writing(what: str):
    """An OSError while writing ``what`` (a full disk, a file size limit) as one FljaxError."""
    try:
        yield
    except OSError as e:
        raise FljaxError(f"cannot write {what} ({os_reason(e) or e}); {SPACE}") from None
