"""Papers are cited by authors, title, venue and year, never by the name of a file the repository
does not ship (the papers' text files, a notes file on the official codes, a review's notes)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
NAMES = ("feddyn-as-initialization.txt", "fedbug.txt", "fedga-gradalign.txt", "feddecay.txt",
         "fedinit.txt", "algorithms.md", "seed-audit")
# a name, or the review's notes by their title ("seed audit 2, N5")
PATTERN = re.compile("|".join(re.escape(name) for name in NAMES) + r"|seed audit", re.IGNORECASE)
SUFFIXES = (".py", ".md", ".json", ".ipynb", ".cff", ".toml", ".txt")
THIS = "tests/test_citations.py"


def tracked_text_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = [path for path in out.splitlines() if path.endswith(SUFFIXES) and path != THIS]
    return [path for path in files
            if not os.path.basename(path).startswith("requirements") or not path.endswith(".txt")]


def test_no_paper_is_cited_by_a_file_name():
    found = []
    for path in tracked_text_files():
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            continue
        with open(full, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                for match in PATTERN.finditer(line):
                    found.append(f"{path}:{number}: {match.group(0)}")
    assert not found, ("cite the paper by its authors, title, venue and year instead of:\n"
                       + "\n".join(found))
