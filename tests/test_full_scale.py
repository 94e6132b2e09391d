"""Every full-scale cell of every sweep file builds for its real shapes, with no data and no GPU
(``fljax.runner.estimate``: the datasets' known shapes, ``fljax.data.shapes``).

Per sweep file (one test each, so the workers share them):

- every cell (each seed): its config validates and its clients split (``client_parts`` on a
  stand-in of the dataset's real sizes: a population the examples cannot fill, a cohort larger
  than the existing users, ... fail here);
- every compiled program (``fljax.runner.grouping.program_key``): its model, algorithm and round
  are built (``make_round``'s checks of local work, cohort, participation and options);
- a program is lowered (its state traced, the round lowered with abstract inputs of the real
  shapes, its clients one after another as on CPU; no compile) when it is the first, of all the
  files a worker runs, with its model on its dataset, its algorithm (and switch) on its model or
  one of its wrappers on its model: a model that cannot take the data's shape, or an algorithm
  or wrapper that cannot run on the model, fails here (about 90 lowerings; all 420 programs
  would take minutes). ``fljax sweep FILE --scale full --plan``
  lowers and compiles every program.
"""

import glob
import json
import os

import pytest

from fljax.runner import estimate, grouping, sweep
from fljax.runner.experiment import client_parts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FULL = sorted(p for p in glob.glob(os.path.join(ROOT, "experiments", "*.json"))
              if "rows" in json.load(open(p)) and "full" in json.load(open(p)).get("scales", {}))
DATA_FIELDS = ("dataset", "partition", "num_clients", "dirichlet_alpha", "min_size",
               "replacement", "classes_per_client", "seed", "validation_fraction",
               "user_val_fraction", "user_test_fraction", "new_users", "sample_users",
               "clients_per_round", "batch_size")
LOWERED: set = set()     # the code paths this worker has lowered (sweep files share many)


def code_paths(config) -> set:
    """What a lowering checks: the model on the dataset's shapes, the algorithm (and its switch)
    on the model, each wrapper on the model."""
    return ({("data", config.dataset, config.model),
             ("algorithm", config.model, config.algorithm, config.switch_to)}
            | {("wrapper", config.model, name) for name in config.options.wrappers})


def test_sweeps_with_a_full_scale_are_found():
    assert len(FULL) >= 40


@pytest.mark.parametrize("path", FULL, ids=lambda p: os.path.basename(p)[:-5])
def test_every_full_scale_cell_builds(path, tmp_path):
    cells = sweep.cells(sweep.load_sweep(path), "full", str(tmp_path))
    shared: dict = {}
    split = set()
    for cell in cells:
        key = tuple(getattr(cell.config, f) for f in DATA_FIELDS)
        if key in split:
            continue
        split.add(key)
        config = cell.config.validate().resolved()
        _, _, parts, _ = client_parts(config, estimate.shapes_of(config, shared)[0])
        assert sum(map(len, parts)) > 0
    first_seed = [c for c in cells if c.seed == cells[0].seed]
    programs = {grouping.program_key(c.config): c.config for c in first_seed}
    for config in programs.values():
        lower = not code_paths(config) <= LOWERED
        built = estimate.abstract_round(config, shared=shared, trace_state=lower, client_chunk=1)
        assert built.round_fn.num_clients == built.data.num_clients
        if lower:
            LOWERED.update(code_paths(config))
            text = built.round_fn.lower(built.state).as_text()
            assert "func.func public @main" in text
