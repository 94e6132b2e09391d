"""Shared by the benchmarks: round-robin timing that drops disturbed rounds, the machine's name,
and writing one ``## `` section of BENCHMARKS.md while keeping the others."""

from __future__ import annotations

import os
import platform
import re
import resource
import statistics
import time
from typing import Callable, NamedTuple, Sequence

import jax

DISTURBED = 0.1   # a timed round is disturbed if other processes took > 0.1 core meanwhile


class Timing(NamedTuple):
    seconds: float   # median wall time of one round
    clean: int       # timed rounds the median is over
    disturbed: int   # timed rounds dropped: other processes used the CPU meanwhile


def busy_cpu_seconds() -> float | None:
    """CPU seconds spent so far by all processes of the machine (Linux), else None."""
    try:
        with open("/proc/stat") as f:
            user, nice, system = f.readline().split()[1:4]
    except OSError:
        return None
    return (int(user) + int(nice) + int(system)) / os.sysconf("SC_CLK_TCK")


def descendants_cpu_seconds() -> float:
    """CPU seconds used so far by the live descendants of this process (Linux; 0 elsewhere):
    the helper processes a benchmark starts (another framework's workers) are its own work."""
    parent, cpu = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue   # the process ended meanwhile
        parent[pid] = fields[1]
        cpu[pid] = int(fields[11]) + int(fields[12])
    children = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    todo, total = list(children.get(str(os.getpid()), [])), 0
    while todo:
        pid = todo.pop()
        total += cpu[pid]
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds used so far by this process, its live descendants and its ended children."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + descendants_cpu_seconds() + ended.ru_utime + ended.ru_stime


def timed_round(run_round: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds of one round, CPU seconds other processes used meanwhile, 0 if unknown)."""
    busy, own, start = busy_cpu_seconds(), own_cpu_seconds(), time.perf_counter()
    run_round()
    wall = time.perf_counter() - start
    if busy is None:
        return wall, 0.0
    return wall, busy_cpu_seconds() - busy - (own_cpu_seconds() - own)


def round_robin(runs: Sequence[Callable[[], None]], rounds: Sequence[int]) -> list[Timing]:
    """One warm-up (compile) round each, then timed rounds taken round-robin over ``runs`` (so a
    drift in the machine's speed hits them alike); a run's time is its median.

    A round during which other processes took more than DISTURBED of a core is dropped and run
    again, up to ``rounds`` extra rounds; if no round of a run is clean, its median is over all.
    """
    for run in runs:
        run()
    clean = [[] for _ in runs]
    disturbed = [[] for _ in runs]
    for _ in range(2 * max(rounds)):
        for run, wanted, good, bad in zip(runs, rounds, clean, disturbed):
            if len(good) < wanted and len(good) + len(bad) < 2 * wanted:
                wall, others = timed_round(run)
                (good if others <= DISTURBED * wall else bad).append(wall)
    return [Timing(statistics.median(good or bad), len(good), len(bad))
            for good, bad in zip(clean, disturbed)]


def machine() -> str:
    """CPU model (from /proc/cpuinfo), core count, jax version and device."""
    cpu = platform.processor() or "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = re.findall(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        cpu = names[0].strip() if names else cpu
    devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
    return f"{cpu}, {os.cpu_count()} cores; jax {jax.__version__} on {devices}"


def read_section(path: str, heading: str) -> str | None:
    """The body of ``## heading`` in the markdown file ``path``, or None."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", f.read(), re.M | re.S)
    return match.group(1).strip() if match else None


def read_subsections(path: str, heading: str) -> dict[str, str]:
    """The ``### title`` parts of ``## heading`` in ``path``: {title: its text}, in order."""
    body = read_section(path, heading) or ""
    return dict(re.findall(r"^### ([^\n]+)\n\n(.*?)\s*(?=^### |\Z)", body, re.M | re.S))


def write_subsections(path: str, heading: str, header: str, parts: dict[str, str]) -> None:
    """Write ``## heading`` in ``path`` as ``header`` then a ``### title`` part per entry."""
    write_section(path, heading,
                  header + "".join(f"\n### {title}\n\n{text}\n" for title, text in parts.items()))


def write_section(path: str, heading: str, body: str) -> None:
    """Replace (or append) ``## heading`` in ``path``; every other section is kept as it was."""
    text = "# Benchmarks\n"
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    block = f"## {heading}\n\n{body.strip()}\n\n"
    pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", re.M | re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    with open(path, "w") as f:
        f.write(text.rstrip("\n") + "\n")
