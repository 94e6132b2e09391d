"""What peers.py and its helper processes (fedjax_round.py, pfl_round.py) share: the answer line,
the workload's command line. Standard library only: each helper runs in its own environment."""

from __future__ import annotations

import argparse
import json

NUM_CLASSES = 10
MARKER = "@peer "            # a helper process's answer line: MARKER + JSON


def answer(message: dict) -> None:
    print(MARKER + json.dumps(message), flush=True)


def widths(text: str) -> tuple[int, ...]:
    """'32,64' -> (32, 64); '' -> ()."""
    return tuple(int(w) for w in text.split(",") if w)


def workload_parser(description: str) -> argparse.ArgumentParser:
    """A helper's command line: the model's shape and the round's clients and local work."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--image", required=True, help="H,W,C of one example")
    parser.add_argument("--channels", default="", help="conv widths, e.g. 32,64 (none: MLP)")
    parser.add_argument("--hidden", default="", help="dense widths before the output layer")
    parser.add_argument("--kernel", type=int, default=5)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--examples", type=int, required=True, help="examples per client")
    parser.add_argument("--cohort", type=int, required=True, help="clients per round")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=1, help="local epochs")
    parser.add_argument("--lr", type=float, default=0.05, help="client SGD learning rate")
    return parser
