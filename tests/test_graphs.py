"""Graphs: Planetoid files the tests write, Louvain communities, FederatedScope's client split, GIN
against a float64 reference of its equations, and GIN training in the compiled round."""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

from fljax import algorithms
from fljax.runner.cli import main
from fljax.data.federated import federate
from fljax.data.graphs import (Graph, federated_graph_dataset, load_planetoid,
                               _undirected, louvain_communities, louvain_split)
from fljax.core.engine import make_round
from fljax.errors import FljaxError
from fljax.models.evaluate import make_evaluator
from fljax.models import make_model


def cliques(sizes=(6, 7, 8), seed=0, features=4):
    """Cliques joined in a ring by one edge each; features hint at the clique."""
    rng = np.random.default_rng(seed)
    edges, start, labels = [], 0, []
    for c, size in enumerate(sizes):
        nodes = range(start, start + size)
        edges += [(a, b) for a in nodes for b in nodes if a < b]
        labels += [c] * size
        start += size
    ends = np.cumsum(sizes)
    edges += [(int(ends[c]) - 1, int(ends[(c + 1) % len(sizes)] - sizes[(c + 1) % len(sizes)]))
              for c in range(len(sizes))]
    labels = np.array(labels)
    x = (np.eye(len(sizes), features)[labels] + 0.8 * rng.normal(size=(len(labels), features)))
    s, r = np.array(edges).T
    both = np.concatenate([s, r]), np.concatenate([r, s])
    return Graph(x.astype(np.float32), labels.astype(np.int32), both[0].astype(np.int32),
                 both[1].astype(np.int32), len(sizes))


def modularity(graph, communities):
    m2 = len(graph.senders)
    degree = np.bincount(graph.senders, minlength=len(graph.y))
    same = communities[graph.senders] == communities[graph.receivers]
    tot = np.bincount(communities, weights=degree)
    return same.sum() / m2 - np.sum((tot / m2) ** 2)


def write_planetoid(folder, graph, test_index):
    """Kipf's files: allx/ally for the first nodes, tx/ty for the test nodes in test.index
    order, the adjacency as a dict of lists."""
    folder.mkdir(parents=True, exist_ok=True)
    onehot = np.eye(graph.num_classes)[graph.y]
    first = np.setdiff1d(np.arange(len(graph.y)), test_index)
    assert (first == np.arange(len(first))).all()
    arrays = {"x": sp.csr_matrix(graph.x[:3]), "y": onehot[:3],
              "allx": sp.csr_matrix(graph.x[first]), "ally": onehot[first],
              "tx": sp.csr_matrix(graph.x[test_index]), "ty": onehot[test_index],
              "graph": {i: [int(r) for s, r in zip(graph.senders, graph.receivers) if s == i]
                        for i in range(len(graph.y))}}
    for part, value in arrays.items():
        with open(folder / f"ind.tiny.{part}", "wb") as f:
            pickle.dump(value, f)
    (folder / "ind.tiny.test.index").write_text("\n".join(map(str, test_index)))


def test_planetoid_files_and_npz_round_trip(tmp_path):
    graph = cliques()
    test_index = np.array([20, 17, 19, 15, 18, 16])          # shuffled, as Kipf's files are
    write_planetoid(tmp_path / "tiny" / "raw", graph, test_index)
    loaded = load_planetoid("tiny", str(tmp_path))
    np.testing.assert_allclose(loaded.x, graph.x, rtol=1e-6)
    np.testing.assert_array_equal(loaded.y, graph.y)
    np.testing.assert_array_equal(loaded.senders, np.sort(graph.senders * 100 + graph.receivers)
                                  // 100)
    np.savez(tmp_path / "tiny.npz", x=graph.x, y=graph.y,
             edge_index=np.stack([graph.senders[::2], graph.receivers[::2]]))
    again = load_planetoid("tiny", str(tmp_path))               # the npz wins
    assert len(again.senders) == len(loaded.senders) and again.num_classes == 3


@pytest.mark.parametrize("case", ["no_dir", "no_files", "bad_file", "bad_npz"])
def test_bad_graph_input_is_one_line(tmp_path, case):
    if case == "no_dir":
        directory = tmp_path / "missing"
    else:
        directory = tmp_path
        if case == "bad_file":
            write_planetoid(tmp_path, cliques(), np.array([20, 19]))
            (tmp_path / "ind.tiny.allx").write_bytes(b"garbage")
        if case == "bad_npz":
            np.savez(tmp_path / "tiny.npz", x=np.zeros((3, 2)))
    with pytest.raises(FljaxError) as err:
        load_planetoid("tiny", str(directory))
    expected = {"no_dir": "does not exist", "no_files": "no Planetoid files ind.tiny.*",
                "bad_file": "ind.tiny.allx' is missing or unreadable",
                "bad_npz": "must be an .npz with x"}[case]
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_louvain_finds_the_cliques_and_is_deterministic():
    graph = cliques(sizes=(6, 7, 8, 5))
    found = louvain_communities(len(graph.y), graph.senders, graph.receivers, seed=3)
    assert len(set(found)) == 4
    for c in range(4):
        assert len(set(found[graph.y == c])) == 1                 # each clique one community
    np.testing.assert_array_equal(
        found, louvain_communities(len(graph.y), graph.senders, graph.receivers, seed=3))
    shuffled = np.random.default_rng(0).permutation(found)
    assert modularity(graph, found) > modularity(graph, shuffled) + 0.3


def test_louvain_split_gives_every_node_to_one_client():
    graph = cliques(sizes=(9, 7, 8, 6, 10))
    parts = louvain_split(graph, num_clients=3, seed=0, delta=2)
    nodes = np.concatenate(parts)
    assert sorted(nodes) == list(range(len(graph.y)))
    assert max(len(p) for p in parts) <= len(graph.y) // 3 + 2


def gin_reference(p, x):
    """Two GIN layers in float64: h' = W2 relu(BN(W1 (h + sum_nbrs h) + b1)) + b2, eval-mode BN."""
    h = x["nodes"].astype(np.float64)
    for i in (1, 2):
        agg = np.zeros_like(h)
        for b in range(len(h)):
            for s, r, m in zip(x["senders"][b], x["receivers"][b], x["edge_mask"][b]):
                agg[b, r] += m * h[b, s]
        z = (h + agg) @ p[f"conv{i}_fc1"]["kernel"] + p[f"conv{i}_fc1"]["bias"]
        bn = p[f"conv{i}_bn"]
        z = (z - bn["mean"]) / np.sqrt(bn["var"] + 1e-5) * bn["scale"] + bn["bias"]
        h = np.maximum(z, 0) @ p[f"conv{i}_fc2"]["kernel"] + p[f"conv{i}_fc2"]["bias"]
        if i == 1:
            h = np.maximum(h, 0)
    return h


def test_gin_matches_float64_reference_and_ignores_padding():
    dataset, _ = federated_graph_dataset(cliques(), 2, seed=0, split=(2, 3), delta=1)
    model = make_model("gin", {k: v[0] for k, v in dataset.x_train.items()}, 3)
    assert model.state_mask["conv1_bn"]["mean"] and not model.state_mask["conv1_fc1"]["kernel"]
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: np.asarray(a, np.float64), model.init(jax.random.key(0)))
        params["conv1_bn"]["mean"] = np.linspace(-0.5, 0.5, 64)
        params["conv2_bn"]["var"] = np.linspace(0.5, 2.0, 64)
        x = dataset.x_train
        got = np.asarray(model.apply(params, jax.tree.map(jnp.asarray, x)))
    want = gin_reference(params, x)
    real = x["node_mask"] == 1
    np.testing.assert_allclose(got[real], want[real], rtol=1e-10, atol=1e-12)
    assert (dataset.y_train[~real] == -1).all() and (dataset.y_test[~real] == -1).all()


def test_gin_trains_on_louvain_clients_in_the_compiled_round():
    graph = cliques(sizes=(12, 14, 10, 13), features=6)
    dataset, y_val = federated_graph_dataset(graph, 2, seed=0, split=(5, 8), delta=2)
    assert ((dataset.y_train >= 0) & (dataset.y_test >= 0)).sum() == 0
    assert (dataset.y_train >= 0).sum() == 20 and (y_val >= 0).sum() == 8
    model = make_model("gin", {k: v[0] for k, v in dataset.x_train.items()}, 4)
    data = federate(dataset.x_train, dataset.y_train, [np.array([0]), np.array([1])], 4)
    round_fn = make_round(algorithms.fedavg(algorithms.local_sgd(0.1)), model, data,
                          clients_per_round=2, batch_size=None, local_steps=5)
    state = round_fn.init_state(model.init(jax.random.key(0)), seed=0)
    evaluate = make_evaluator(model, dataset.x_test, dataset.y_test)
    for _ in range(10):
        state, metrics = round_fn(state)
    assert float(evaluate(state.params)["accuracy"]) > 0.8
    assert not np.allclose(state.params["conv1_bn"]["mean"], 0.0)     # statistics were carried


def test_planetoid_trains_from_the_cli(tmp_path):
    graph = cliques(sizes=(20, 22, 18), features=5)
    np.savez(tmp_path / "cora.npz", x=graph.x, y=graph.y,
             edge_index=np.stack([graph.senders, graph.receivers]))
    code = main(["--dataset", "planetoid/cora", "--data-dir", str(tmp_path), "--model", "gin",
                 "--partition", "natural", "--num-clients", "2", "--clients-per-round", "2",
                 "--batch-size", "0", "--local-steps", "2", "--rounds", "2",
                 "--eval-every", "2", "--quiet", "--out-dir", str(tmp_path / "run")])
    assert code == 0


def test_per_user_node_splits_give_each_client_its_own_train_val_test():
    """user_split: each client's nodes split on their own (20% val, 20% test, the rest train),
    three labelled copies of its subgraph as its train / val / test examples."""
    from fljax.data.users import held_out
    graph = cliques(sizes=(12, 14, 10, 13), features=6)
    plain, plain_val = federated_graph_dataset(graph, 3, seed=1, delta=2, split=(5, 8))
    dataset, _ = federated_graph_dataset(graph, 3, seed=1, delta=2, split=(5, 8),
                                         user_split=(0.2, 0.2))
    np.testing.assert_array_equal(dataset.role_train, [0, 1, 2] * 3)
    np.testing.assert_array_equal(dataset.user_train, [0, 0, 0, 1, 1, 1, 2, 2, 2])
    for c in range(3):
        nodes = plain.x_train["node_mask"][c] == 1
        np.testing.assert_array_equal(dataset.x_train["nodes"][3 * c], plain.x_train["nodes"][c])
        labelled = dataset.y_train[3 * c:3 * c + 3] >= 0                   # [3, Vmax]
        assert (labelled.sum(axis=0)[nodes] == 1).all()                    # each node once
        assert not labelled[:, ~nodes].any()
        n = int(nodes.sum())
        assert labelled.sum(axis=1).tolist() == [n - 2 * held_out(n, 0.2), held_out(n, 0.2),
                                                 held_out(n, 0.2)]
        truth = np.maximum.reduce([plain.y_train[c], plain.y_test[c], plain_val[c]])
        assert (truth[nodes] >= 0).all()                                   # every node's class
        for copy in range(3):
            got = dataset.y_train[3 * c + copy]
            np.testing.assert_array_equal(got[got >= 0], truth[got >= 0])
        np.testing.assert_array_equal(dataset.y_test[c], dataset.y_train[3 * c + 2])


def test_planetoid_new_and_existing_users_from_the_cli(tmp_path):
    """FedDecay's PubMed protocol: a held-out Louvain client is a new user, every user scored
    on its own test nodes after fine-tuning."""
    import json
    graph = cliques(sizes=(20, 22, 18, 21), features=5)
    np.savez(tmp_path / "cora.npz", x=graph.x, y=graph.y,
             edge_index=np.stack([graph.senders, graph.receivers]))
    code = main(["--dataset", "planetoid/cora", "--data-dir", str(tmp_path), "--model", "gin",
                 "--partition", "natural", "--num-clients", "4", "--clients-per-round", "3",
                 "--new-users", "0.25", "--user-val-fraction", "0.2",
                 "--user-test-fraction", "0.2", "--batch-size", "0", "--local-steps", "2",
                 "--rounds", "2", "--eval-every", "2", "--quiet", "--out-dir",
                 str(tmp_path / "run")])
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    final = [r for r in records if r["kind"] == "eval"][-1]
    assert 0 <= final["new_test_acc"] <= 1 and 0 <= final["existing_test_acc"] <= 1


def test_louvain_is_python_louvains_best_partition():
    """FederatedScope's communities: community.best_partition on the networkx graph, same seed."""
    import community
    import networkx as nx

    rng = np.random.default_rng(5)
    n = 60
    edges = rng.integers(0, n, (2, 240))
    senders, receivers = _undirected(edges[0], edges[1], n)
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((int(s), int(r)) for s, r in zip(senders, receivers) if s < r)
    for seed in (0, 1, 7):
        expected = community.best_partition(graph, resolution=1.0, random_state=seed)
        found = louvain_communities(n, senders, receivers, seed=seed)
        assert found.tolist() == [expected[v] for v in range(n)]


def federatedscope_split(partition, num_nodes, num_clients, delta):
    """FederatedScope's LouvainSplitter grouping, restated with dicts as it is written: communities
    in order of first appearance, each cut from the front into pieces of V/C - delta nodes (the
    cut pieces appended after every community), a stable largest-first sort, then round-robin
    under V/C + delta nodes per client."""
    groups = {}
    for node in sorted(partition):
        groups.setdefault(partition[node], []).append(node)
    limit, cap = num_nodes // num_clients - delta, num_nodes // num_clients + delta
    cut = {}
    for key in list(groups):
        while len(groups[key]) > limit:
            cut[len(groups) + len(cut) + 1], groups[key] = groups[key][:limit], groups[key][limit:]
    groups.update(cut)
    clients, i = [[] for _ in range(num_clients)], 0
    for nodes in sorted(groups.values(), key=len, reverse=True):
        while len(nodes) + len(clients[i]) > cap:
            i = (i + 1) % num_clients
        clients[i] += nodes
        i = (i + 1) % num_clients
    return clients


def test_louvain_split_is_federatedscopes_grouping():
    import community
    import networkx as nx

    graph = cliques(sizes=(12, 7, 9, 5, 9, 3, 14, 4))
    nxg = nx.Graph()
    nxg.add_nodes_from(range(len(graph.y)))
    nxg.add_edges_from((int(s), int(r)) for s, r in zip(graph.senders, graph.receivers) if s < r)
    for seed, clients, delta in ((0, 3, 10), (4, 3, 10), (1, 4, 5), (2, 2, 20)):
        expected = federatedscope_split(
            community.best_partition(nxg, random_state=seed), len(graph.y), clients, delta)
        found = louvain_split(graph, num_clients=clients, seed=seed, delta=delta)
        assert [p.tolist() for p in found] == [sorted(c) for c in expected]
