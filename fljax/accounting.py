"""Communication and compute accounting: bytes a round sends, FLOPs it runs.

Bytes: a participating client receives ``down`` and sends ``up`` model-sized vectors in round t
(``Algorithm.payload``: (1, 1) for FedAvg; SCAFFOLD (2, 2): the model and a control variate both
ways; FedGA (2, 2): two exchanges; FedCM (2, 1)), so

    bytes_down(t) = down(t) |S^t| P,      bytes_up(t) = up(t) |S^t| P,

with P the bytes of the model's parameters (scalars such as FedExP's norms are not counted).

FLOPs: XLA's own cost analysis counts the body of a loop once, whatever its trip count, so a round
(a scan over clients of a scan over local steps) would look as cheap as one step. ``hlo_flops``
walks the compiled program instead: 2 x multiply-adds of every dot and convolution, times the
known trip count of each loop around it; a conditional counts its most expensive branch, so under
Bernoulli participation (idle chunks skipped by a conditional) the count is that of every client
slot and the runner scales it by |S^t| / N. ``elementwise=True`` also counts one FLOP per output element of
every arithmetic elementwise op (add, multiply, exp, compare, select, ...) and one per input element
of every reduce (a reduction XLA splits in two stages adds its partial sums), inside fusions too: the vector work that a method such as FedDyn adds per step
(its linear and quadratic terms), which the matmul count leaves out.
"""

from __future__ import annotations

import functools
import math
import re

import jax

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_ASSIGNMENT = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([\w\-]+)\((.*)$")
_SHAPE = re.compile(r"^[a-z0-9]+\[([0-9,]*)\]")
_CALLEES = re.compile(r"(?:calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def param_bytes(params) -> int:
    """Bytes of a parameter tree."""
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))


def param_bits(params) -> int:
    """Bits of a parameter tree (arrays or shapes)."""
    return sum(leaf.size * jax.numpy.dtype(leaf.dtype).itemsize * 8
               for leaf in jax.tree.leaves(params))


def client_bits(algorithm, round_index: int, params) -> tuple[int, int]:
    """(bits down, bits up) per participating client of round t: the algorithm's exact
    ``message_bits`` if it has them (a compressed uplink), else its ``payload`` copies of the
    model ``params``."""
    if algorithm.message_bits is not None:
        return algorithm.message_bits(round_index, params)
    down, up = algorithm.payload(round_index)
    return down * param_bits(params), up * param_bits(params)


def _instruction(line: str) -> tuple[str, str, str, str] | None:
    """(name, shape, opcode, text after the opening parenthesis) of an HLO instruction line."""
    assignment = _ASSIGNMENT.match(line)
    if assignment is None:
        return None
    name, text = assignment.groups()
    if text.startswith("("):                       # a tuple shape: up to its closing parenthesis
        depth = 0
        for end, char in enumerate(text):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                break
        shape, text = text[:end + 1], text[end + 1:]
    else:
        shape, _, text = text.partition(" ")
    opcode = _OPCODE.match(text)
    return None if opcode is None else (name, shape, *opcode.groups())


def _dims(shape: str) -> list[int] | None:
    match = _SHAPE.match(shape)
    if match is None:
        return None
    return [int(d) for d in match.group(1).split(",") if d]


def _operands(rest: str) -> list[str]:
    depth, names, current = 0, [], ""
    for char in rest:
        if char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                break
            depth -= 1
        elif char == "," and depth == 0:
            names.append(current.strip())
            current = ""
            continue
        current += char
    names.append(current.strip())
    return [n.split()[-1].lstrip("%") for n in names if n]


def _dot_flops(out: list[int], lhs: list[int], attributes: str) -> float:
    match = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", attributes)
    contracting = [int(d) for d in match.group(1).split(",") if d] if match else []
    return 2.0 * math.prod(out) * math.prod(lhs[d] for d in contracting)


def _conv_flops(out: list[int], kernel: list[int], attributes: str) -> float:
    labels = re.search(r"dim_labels=\w+_(\w+)->", attributes).group(1)
    return 2.0 * math.prod(out) * math.prod(kernel) / kernel[labels.index("o")]


# HLO opcodes of one floating-point (or comparison) operation per output element.
ELEMENTWISE = frozenset({
    "add", "subtract", "multiply", "divide", "remainder", "power", "maximum", "minimum", "negate",
    "abs", "sign", "exponential", "exponential-minus-one", "log", "log-plus-one", "sqrt", "rsqrt",
    "cbrt", "tanh", "logistic", "sine", "cosine", "floor", "ceil", "round-nearest-afz",
    "round-nearest-even", "compare", "select", "clamp", "atan2", "erf"})


def hlo_flops(text: str, elementwise: bool = False) -> float:
    """FLOPs of a compiled HLO module's entry computation, loops counted by their trip counts;
    with ``elementwise``, elementwise ops and reductions count too (module doc)."""
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = header.group(1)
            computations[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif line.startswith("}"):
            current = None
        elif current is not None:
            computations[current].append(line)

    @functools.lru_cache(maxsize=None)
    def cost(name: str) -> float:
        shapes, total = {}, 0.0
        for line in computations.get(name, []):
            parsed = _instruction(line)
            if parsed is None:
                continue
            result, shape, opcode, rest = parsed
            shapes[result] = _dims(shape)
            operands = _operands(rest)
            if opcode == "dot":
                total += _dot_flops(shapes[result], shapes[operands[0]], rest)
            elif opcode == "convolution":
                total += _conv_flops(shapes[result], shapes[operands[1]], rest)
            elif elementwise and opcode in ELEMENTWISE and shapes[result] is not None:
                total += math.prod(shapes[result])
            elif elementwise and opcode in ("reduce", "reduce-window") and \
                    shapes.get(operands[0]) is not None:
                total += math.prod(shapes[operands[0]])
            elif opcode == "while":
                body = re.search(r"body=%?([\w.\-]+)", rest).group(1)
                condition = re.search(r"condition=%?([\w.\-]+)", rest).group(1)
                trips = _TRIP.search(rest)
                total += (int(trips.group(1)) if trips else 1) * (cost(body) + cost(condition))
            elif opcode == "conditional":
                branches = _BRANCHES.search(rest)
                names = ([b.strip().lstrip("%") for b in branches.group(1).split(",")]
                         if branches else _CALLEES.findall(rest))
                total += max(cost(b) for b in names)
            else:
                total += sum(cost(callee) for callee in _CALLEES.findall(rest))
        return total

    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return cost(entry)
