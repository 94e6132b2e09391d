"""The pages a reader meets first: a short README that starts with the two commands, an index of
the experiments, and the project's face files."""

import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..")


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def test_readme_is_a_front_page_that_starts_with_the_two_commands():
    lines = read("README.md").splitlines()
    assert len(lines) <= 150, len(lines)
    commands = [line.strip() for line in lines[:12] if line.startswith("    ")]
    assert len(commands) == 2, commands
    assert commands[0].endswith("fljax --config experiments/digits_fedavg.json")
    assert commands[1].endswith("python -m pytest -q -n 2")
    ci = read(".ci/run")
    assert commands[1].split("&& ", 1)[1] in ci    # CI runs the README's test command


def test_experiments_readme_is_an_index():
    lines = read("experiments/README.md").splitlines()
    assert max(map(len, lines)) <= 300
    claims = [line for line in lines if line.startswith("|") and re.search(
        r"\| [^|]*\b(reproduced|not run)\b[^|]*\| \[page\]\(", line)]
    assert len(claims) >= 20, "the claims table gives each claim one line, verdict and page"


def test_the_project_has_its_face():
    assert "Apache License" in read("LICENSE") and "Version 2.0" in read("LICENSE")
    citation = read("CITATION.cff")
    assert "cff-version: 1.2.0" in citation and "references:" in citation
    for name in ("CONTRIBUTING.md", "CHANGELOG.md"):
        assert read(name).strip()
