"""Natural users: LEAF-format JSON and npz files with user ids, read from local files the tests write,
trained end to end from the CLI; Shakespeare's next-character targets."""

import json

import jax
import numpy as np
import pytest

from fljax.runner.cli import main
from fljax.data.leaf import LETTERS, load_leaf, load_user_npz, write_leaf, write_synthetic
from fljax.data.loaders import load_dataset
from fljax.errors import FljaxError


TEXT = "To be, or not to be: that is the question. Whether 'tis nobler in the mind to suffer " * 2


def shakespeare_users():
    """Windows of 80 characters of TEXT and the character after each, over three users."""
    users, start = {}, 0
    for u, name in enumerate(["HAMLET", "OPHELIA", "POLONIUS"]):
        starts = range(start, start + u + 2)
        users[name] = ([TEXT[i:i + 80] for i in starts], [TEXT[i + 80] for i in starts])
        start += u + 2
    return users


def test_leaf_split_round_trip_keeps_every_users_examples(tmp_path):
    rng = np.random.default_rng(0)
    train = {f"f{u}": (rng.random((u + 2, 784)).round(3).tolist(), [u, 61] + [0] * u)
             for u in range(3)}
    test = {"f0": ([[0.5] * 784], [7]), "f2": ([[0.25] * 784] * 2, [1, 2]),
            "only_test": ([[0.0] * 784], [3])}
    write_leaf(tmp_path / "femnist", train, "train", users_per_file=2)
    write_leaf(tmp_path / "femnist", test, "test")
    ds = load_leaf(str(tmp_path / "femnist"))           # the kind from the directory name
    assert ds.name == "leaf/femnist" and ds.num_classes == 62
    assert ds.x_train.shape == (9, 28, 28, 1) and ds.x_train.dtype == np.float32
    for u in range(3):
        mine = ds.user_train == u
        np.testing.assert_allclose(ds.x_train[mine].reshape(-1, 784), train[f"f{u}"][0],
                                   rtol=1e-6)
        assert ds.y_train[mine].tolist() == train[f"f{u}"][1]
    assert ds.user_test.tolist() == [0, 2, 2] and ds.y_test.tolist() == [7, 1, 2]   # test-only
    np.testing.assert_allclose(ds.x_test[0], 0.5)                           # user dropped


def test_all_data_is_split_per_user_seeded(tmp_path):
    write_synthetic(str(tmp_path / "synthetic"), num_users=6, seed=1)
    a = load_leaf(str(tmp_path / "synthetic"), test_fraction=0.25, seed=3)
    b = load_leaf(str(tmp_path / "synthetic"), test_fraction=0.25, seed=3)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    assert a.x_train.shape[1] == 60 and sorted(set(a.user_train)) == list(range(6))
    for u in range(6):
        n_train, n_test = np.sum(a.user_train == u), np.sum(a.user_test == u)
        assert n_train >= 1 and n_test == round(0.25 * (n_train + n_test))


def test_shakespeare_targets_are_the_next_character_at_every_position(tmp_path):
    users = shakespeare_users()
    write_leaf(tmp_path / "shakespeare", users, "all_data")
    ds = load_leaf(str(tmp_path / "shakespeare"), test_fraction=0.3)
    assert ds.x_train.dtype == np.int32 and ds.x_train.shape[1] == 80
    assert ds.y_train.shape == ds.x_train.shape and ds.num_classes == len(LETTERS) == 80
    decode = lambda row: "".join(LETTERS[i] for i in row)
    for x, y in zip(ds.x_train, ds.y_train):
        text = decode(x)
        assert decode(y) == text[1:] + TEXT[TEXT.index(text) + 80]


def test_sent140_vocabulary_comes_from_training_users(tmp_path):
    record = lambda text: ["id", "date", "query", "user", text]
    write_leaf(tmp_path / "sent140", {"a": ([record("good day good"), record("bad")], [1, 0])},
               "train")
    write_leaf(tmp_path / "sent140", {"a": ([record("good unseen")], [1])}, "test")
    ds = load_leaf(str(tmp_path / "sent140"))
    assert ds.x_train.shape == (2, 25) and ds.num_classes == 2
    good, day, bad = 2, 3, 4           # by frequency, ties in first-seen order; 0 pad, 1 unknown
    assert ds.x_train[0, :4].tolist() == [good, day, good, 0]
    assert ds.x_test[0, :3].tolist() == [good, 1, 0]


def test_npz_with_user_ids(tmp_path):
    path = tmp_path / "users.npz"
    np.savez(path, x_train=np.arange(12, dtype=np.int64).reshape(6, 2), y_train=np.arange(6) % 2,
             x_test=np.zeros((3, 2), np.int64), y_test=np.array([0, 1, 1]),
             client_id_train=np.array([40, 7, 7, 40, 9, 9]), client_id_test=np.array([7, 8, 40]))
    ds = load_dataset(str(path))
    assert ds.x_train.dtype == np.int64 and ds.user_train.tolist() == [2, 0, 0, 2, 1, 1]
    assert ds.user_test.tolist() == [0, 2] and ds.y_test.tolist() == [0, 1]   # user 8 dropped


@pytest.mark.parametrize("case", ["missing", "empty", "not_json", "no_users", "count", "pixels",
                                  "kind"])
def test_bad_leaf_input_is_one_line(tmp_path, case):
    root = tmp_path / "femnist"
    folder = root / "data" / "all_data"
    if case != "missing":
        folder.mkdir(parents=True)
    good = {"users": ["u"], "num_samples": [1], "user_data": {"u": {"x": [[0.0] * 784], "y": [1]}}}
    content = {"not_json": "{users: oops", "no_users": json.dumps({"x": 1}),
               "count": json.dumps({**good, "num_samples": [2]}),
               "pixels": json.dumps({**good, "user_data": {"u": {"x": [[0.0] * 5], "y": [1]}}}),
               "kind": json.dumps(good)}.get(case)
    if content is not None:
        (folder / "part.json").write_text(content)
    with pytest.raises(FljaxError) as err:
        load_leaf(str(root), "emnist" if case == "kind" else None)
    message = str(err.value)
    assert "\n" not in message
    expected = {"missing": "does not exist", "empty": "has no .json files",
                "not_json": "part.json' is not valid JSON", "no_users": "'users' and 'user_data'",
                "count": "num_samples 2", "pixels": "784 pixel values",
                "kind": "must be one of"}[case]
    assert expected in message


def test_bad_user_npz_is_one_line(tmp_path):
    path = tmp_path / "u.npz"
    np.savez(path, x_train=np.zeros((2, 2)), y_train=np.zeros(2, int), x_test=np.zeros((1, 2)),
             y_test=np.zeros(1, int), client_id_train=np.zeros(3, int),
             client_id_test=np.zeros(1, int))
    with pytest.raises(FljaxError, match="must have one equal, non-zero length, got 2, 2, 3"):
        load_user_npz(str(path))


def test_natural_users_train_end_to_end_from_the_cli(tmp_path):
    write_synthetic(str(tmp_path / "leaf"), num_users=8, seed=0)
    out = tmp_path / "run"
    code = main(["--dataset", "leaf/synthetic", "--data-dir", str(tmp_path / "leaf"),
                 "--partition", "natural", "--num-clients", "8", "--clients-per-round", "4",
                 "--model", "mlp", "--batch-size", "10", "--local-epochs", "1",
                 "--lr", "0.05", "--rounds", "6", "--eval-every", "3",
                 "--quiet", "--out-dir", str(out)])
    assert code == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [line for line in lines if line["kind"] == "eval"]
    assert [e["round"] for e in evals] == [3, 6] and evals[-1]["loss"] < evals[0]["loss"]
    rounds = [line for line in lines if line["kind"] == "round"]
    assert all(0 <= c < 8 for r in rounds for c in r["clients"])


def test_sample_users_gives_exactly_the_clients_the_config_asks_for(tmp_path, capsys):
    """LEAF's sampled output (train/test folders, writers in files of 100 as LEAF writes them)
    with more writers than the federation: sample_users keeps exactly num_clients of them, the
    same ones for every run seed; fewer writers than asked is one line."""
    rng = np.random.default_rng(0)
    users = {f"f{k:04d}_{k % 7:02d}": (rng.random((3 + k % 4, 784)).tolist(),
                                       rng.integers(0, 62, 3 + k % 4).tolist())
             for k in range(23)}
    write_leaf(str(tmp_path / "femnist"), {n: (x[1:], y[1:]) for n, (x, y) in users.items()},
               "train", users_per_file=10)
    write_leaf(str(tmp_path / "femnist"), {n: (x[:1], y[:1]) for n, (x, y) in users.items()},
               "test", users_per_file=10)
    whole = load_dataset("leaf/femnist", data_dir=str(tmp_path / "femnist"))
    assert len(np.unique(whole.user_train)) == 23
    kept = load_dataset("leaf/femnist", data_dir=str(tmp_path / "femnist"), sample_users=20)
    again = load_dataset("leaf/femnist", data_dir=str(tmp_path / "femnist"), sample_users=20,
                         seed=7)
    assert np.array_equal(np.unique(kept.user_train), np.arange(20))
    np.testing.assert_array_equal(kept.x_train, again.x_train)
    # every kept writer's examples are its own, unchanged: each kept row is a row of the whole
    whole_rows = {row.tobytes() for row in whole.x_train}
    assert all(row.tobytes() in whole_rows for row in kept.x_train) and len(kept.y_train) < len(
        whole.y_train)
    out = tmp_path / "run"
    flags = ["--dataset", "leaf/femnist", "--data-dir", str(tmp_path / "femnist"),
             "--partition", "natural", "--num-clients", "20", "--clients-per-round", "4",
             "--model", "mlp", "--batch-size", "2", "--rounds", "2", "--quiet"]
    assert main([*flags, "--sample-users", "20", "--out-dir", str(out)]) == 0
    capsys.readouterr()
    assert main([*flags, "--out-dir", str(tmp_path / "r2")]) == 2      # 23 writers, 20 clients
    assert "num_clients must be the dataset's 23 users, got 20" in capsys.readouterr().err
    assert main([*flags, "--sample-users", "30", "--out-dir", str(tmp_path / "r3")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sample_users=30 asks for more users than" in err
    with pytest.raises(FljaxError, match="sample_users draws users of a LEAF dataset"):
        load_dataset("digits", sample_users=3)


def user_npz(path, test_ids=True, ids=("b", "a", "c")):
    """Three users (ids given as any integers or strings) of 30 vectors each; their test
    examples' users optional."""
    rng = np.random.default_rng(0)
    arrays = dict(x_train=rng.normal(size=(90, 4)).astype(np.float32), y_train=np.arange(90) % 2,
                  x_test=rng.normal(size=(12, 4)).astype(np.float32), y_test=np.arange(12) % 2,
                  client_id_train=np.repeat(np.array(ids), 30))
    if test_ids:
        arrays["client_id_test"] = np.repeat(np.array(ids), 4)
    np.savez(path, **arrays)
    return str(path)


def test_an_npz_with_users_trains_on_them_or_says_why_not_in_one_line(tmp_path, capsys):
    path = user_npz(tmp_path / "users.npz", test_ids=False)
    run = ["--dataset", path, "--model", "linear", "--rounds", "1", "--local-steps", "1",
           "--clients-per-round", "2", "--quiet"]
    assert main(run + ["--out-dir", str(tmp_path / "dirichlet")]) == 2     # the default split
    err = capsys.readouterr().err
    assert err == (f"fljax: error: dataset {path!r} comes with 3 users (client_id_train): train "
                   f"on them with --partition natural --num-clients 3, or leave client_id_train "
                   f"and client_id_test out of the file to split its examples by partition "
                   f"'dirichlet'\n")
    assert main(run + ["--partition", "iid", "--out-dir", str(tmp_path / "iid")]) == 2
    assert main(run + ["--partition", "natural", "--num-clients", "3",
                       "--out-dir", str(tmp_path / "natural")]) == 0
    log = [json.loads(line) for line in (tmp_path / "natural" / "metrics.jsonl").open()]
    assert {c for line in log if line["kind"] == "round" for c in line["clients"]} <= {0, 1, 2}


def test_an_npz_needs_no_test_users_and_takes_string_ids(tmp_path):
    """client_id_test is optional (the global test set is scored whole); ids may be strings,
    numbered in sorted order as partition natural numbers raw ids."""
    without = load_dataset(user_npz(tmp_path / "a.npz", test_ids=False))
    assert without.user_test is None and len(without.y_test) == 12
    assert without.user_train.tolist() == [1] * 30 + [0] * 30 + [2] * 30   # a, b, c
    with_ids = load_dataset(user_npz(tmp_path / "b.npz", ids=(12, -5, 400)))
    assert with_ids.user_test.tolist() == [1] * 4 + [0] * 4 + [2] * 4


def test_leaf_dataset_needs_its_directory(capsys):
    assert main(["--dataset", "leaf/femnist", "--partition", "natural", "--quiet"]) == 2
    assert "needs --data-dir" in capsys.readouterr().err


def test_shakespeare_lstm_trains_in_the_compiled_round(tmp_path):
    from fljax import algorithms
    from fljax.data.federated import federate
    from fljax.data.partition import natural
    from fljax.core.engine import make_round
    from fljax.models.evaluate import make_evaluator
    from fljax.models import make_model

    write_leaf(tmp_path / "shakespeare", shakespeare_users(), "all_data")
    ds = load_leaf(str(tmp_path / "shakespeare"), test_fraction=0.3)
    model = make_model("char_lstm", ds.x_train[0], ds.num_classes)
    data = federate(ds.x_train, ds.y_train, natural(ds.user_train, 3), ds.num_classes)
    round_fn = make_round(algorithms.fedavg(algorithms.local_sgd(1.0, clip_norm=5.0)), model,
                          data, clients_per_round=3, batch_size=2, local_steps=10)
    state = round_fn.init_state(model.init(jax.random.key(0)), seed=0)
    evaluate = make_evaluator(model, ds.x_train, ds.y_train)
    before = float(evaluate(state.params)["loss"])
    for _ in range(4):
        state, metrics = round_fn(state)
    after = evaluate(state.params)
    assert float(after["loss"]) < 0.8 * before     # the characters' statistics are being learnt
    assert round_fn.compilations() == 1


def test_femnist_is_normalized_as_pfl_bench_does(tmp_path):
    """load_dataset('leaf/femnist') = (LEAF's values - 0.1307) / 0.3081 (pFL-Bench's FEMNIST,
    the data FedDecay's tables use); load_leaf keeps LEAF's values."""
    rng = np.random.default_rng(1)
    train = {"a": (rng.random((3, 784)).round(3).tolist(), [1, 2, 3])}
    write_leaf(tmp_path / "femnist", train, "train")
    write_leaf(tmp_path / "femnist", {"a": ([[0.5] * 784], [4])}, "test")
    raw = load_leaf(str(tmp_path / "femnist"))
    ds = load_dataset("leaf/femnist", data_dir=str(tmp_path / "femnist"))
    np.testing.assert_allclose(ds.x_train, (raw.x_train - 0.1307) / 0.3081, rtol=1e-6)
    np.testing.assert_allclose(ds.x_test, (0.5 - 0.1307) / 0.3081, rtol=1e-6)
