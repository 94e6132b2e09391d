"""Graph node classification as FederatedScope runs it for FedDecay's PubMed: Planetoid data from a
local directory, a Louvain community split into clients, each client one example (its subgraph).

* ``load_planetoid``: the raw Planetoid files (Kipf & Welling's ``ind.NAME.*`` pickles) or an
  ``.npz`` with ``x``, ``y``, ``edge_index``.
* ``louvain_communities``: Louvain modularity optimisation (Blondel et al. 2008) by
  python-louvain's ``community.best_partition``, called as FederatedScope calls it.
* ``louvain_split``: FederatedScope's ``LouvainSplitter``: communities larger than
  V/C - delta are cut into pieces of that size; pieces, largest first, go round-robin to the
  clients, skipping a client that would exceed V/C + delta.
* ``federated_graph_dataset``: a Dataset with one example per client, its subgraph (edges inside
  the client), padded to the largest client; labels -1 where a node is not scored.

Exact vs approximate (docs/guides/data.md): the Louvain communities (python-louvain, FederatedScope's
library, resolution 1, seeded by the run's seed), the split rule and GIN follow FederatedScope, so
the clients are FederatedScope's when its numpy generator is in the seeded state; the node split is
FederatedScope's random Planetoid split for PubMed (3,943 train nodes per class, 3,943 val, the rest
test) drawn with fljax's generator.
"""

from __future__ import annotations

import os
import pickle
from typing import NamedTuple

import numpy as np

from fljax.data.dataset import Dataset
from fljax.data.users import held_out
from fljax.errors import FljaxError

PLANETOID_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
# FederatedScope's random Planetoid splits: (train nodes per class, validation nodes)
SPLITS = {"pubmed": (3943, 3943), "cora": (232, 542), "citeseer": (332, 665)}


class Graph(NamedTuple):
    x: np.ndarray          # float32 [V, F] node features
    y: np.ndarray          # int32 [V] node classes
    senders: np.ndarray    # int32 [E]: every undirected edge both ways, no self loops
    receivers: np.ndarray
    num_classes: int


def _undirected(senders, receivers, num_nodes: int):
    """Both directions of every edge once, without self loops, sorted."""
    pairs = np.stack([np.concatenate([senders, receivers]), np.concatenate([receivers, senders])])
    pairs = pairs[:, pairs[0] != pairs[1]]
    codes = np.unique(pairs[0].astype(np.int64) * num_nodes + pairs[1])
    return (codes // num_nodes).astype(np.int32), (codes % num_nodes).astype(np.int32)


def _planetoid_files(name: str, data_dir: str) -> str:
    for folder in (data_dir, os.path.join(data_dir, name, "raw"),
                   os.path.join(data_dir, {"pubmed": "PubMed", "cora": "Cora",
                                           "citeseer": "CiteSeer"}.get(name, name), "raw")):
        if os.path.isfile(os.path.join(folder, f"ind.{name}.graph")):
            return folder
    raise FljaxError(f"no Planetoid files ind.{name}.* in {data_dir!r} (or its {name}/raw "
                     f"folder), and no {name}.npz; copy them there (fljax never downloads)")


def _read_planetoid(name: str, folder: str):
    """(x, y, edges) from Kipf's files: the test nodes' rows ``tx``/``ty`` go to the node ids in
    ``test.index`` (nodes of the id range that no file covers, citeseer's, get zero rows)."""
    parts = {}
    for part in PLANETOID_PARTS:
        path = os.path.join(folder, f"ind.{name}.{part}")
        try:
            if part == "test.index":
                parts[part] = np.loadtxt(path, dtype=np.int64, ndmin=1)
            else:
                with open(path, "rb") as f:
                    parts[part] = pickle.load(f, encoding="latin1")
        except (OSError, ValueError, pickle.UnpicklingError, EOFError, AttributeError):
            raise FljaxError(f"Planetoid file {path!r} is missing or unreadable") from None
    dense = lambda m: np.asarray(m.todense() if hasattr(m, "todense") else m, np.float32)
    allx, tx, ally, ty = (dense(parts[k]) for k in ("allx", "tx", "ally", "ty"))
    test = parts["test.index"]
    size = max(len(allx), int(test.max()) + 1)
    x = np.zeros((size, allx.shape[1]), np.float32)
    labels = np.zeros((size, ally.shape[1]), np.float32)
    x[:len(allx)], labels[:len(ally)] = allx, ally
    x[test], labels[test] = tx, ty
    graph = parts["graph"]
    senders = np.array([s for s, ns in graph.items() for _ in ns], np.int64)
    receivers = np.array([r for ns in graph.values() for r in ns], np.int64)
    return x, labels.argmax(1), np.stack([senders, receivers])


def load_planetoid(name: str, data_dir: str) -> Graph:
    """Planetoid ``name`` (pubmed, cora, citeseer) from ``data_dir``: ``{name}.npz`` (x [V, F], y
    [V], edge_index [2, E]) or the raw files, read as Kipf's and PyG's loaders read them (test
    nodes reordered by ``test.index``)."""
    data_dir = os.path.expanduser(os.fspath(data_dir))
    if not os.path.isdir(data_dir):
        raise FljaxError(f"graph data directory {data_dir!r} does not exist")
    npz = os.path.join(data_dir, f"{name}.npz")
    if os.path.isfile(npz):
        try:
            with np.load(npz, allow_pickle=False) as f:
                x, y, edges = f["x"], f["y"], f["edge_index"]
        except (KeyError, OSError, ValueError, EOFError):
            raise FljaxError(f"graph file {npz!r} must be an .npz with x [V, F], y [V] and "
                             f"edge_index [2, E]") from None
    else:
        x, y, edges = _read_planetoid(name, _planetoid_files(name, data_dir))
    x, y, edges = np.asarray(x, np.float32), np.asarray(y), np.asarray(edges)
    if x.ndim != 2 or y.shape != (len(x),) or edges.ndim != 2 or edges.shape[0] != 2 or (
            edges.size and (edges.min() < 0 or edges.max() >= len(x))):
        raise FljaxError(f"graph {name!r} in {data_dir!r} must have x [V, F], y [V] and edges "
                         f"[2, E] in [0, V); got {x.shape}, {y.shape}, {edges.shape}")
    senders, receivers = _undirected(edges[0], edges[1], len(x))
    return Graph(x, y.astype(np.int32), senders, receivers, int(y.max()) + 1)


def louvain_communities(num_nodes: int, senders: np.ndarray, receivers: np.ndarray,
                        seed: int = 0, resolution: float = 1.0) -> np.ndarray:
    """Each node's community (0..K-1, best_partition's numbers) by python-louvain's
    ``community.best_partition`` (Blondel et al. 2008), as FederatedScope's ``LouvainSplitter``
    calls it: on the undirected networkx graph of nodes 0..V-1 whose edges are added in
    PyG's ``to_networkx`` order (each edge once, lower id first, sorted), resolution 1 (its
    default); FederatedScope leaves ``random_state`` to numpy's global generator, which its runs
    seed with the run's seed: here ``random_state=seed``, the same generator when nothing drew
    from the global one after seeding."""
    try:   # imported here: only graph datasets need networkx and python-louvain
        import community as community_louvain
        import networkx as nx
    except ImportError:
        raise FljaxError("graph datasets need python-louvain and networkx: pip install "
                         "python-louvain==0.16 networkx==3.6.1") from None
    senders, receivers = np.asarray(senders, np.int64), np.asarray(receivers, np.int64)
    once = senders < receivers
    order = np.lexsort((receivers[once], senders[once]))
    graph = nx.Graph()
    graph.add_nodes_from(range(num_nodes))
    graph.add_edges_from(zip(senders[once][order].tolist(), receivers[once][order].tolist()))
    partition = community_louvain.best_partition(graph, resolution=resolution,
                                                 random_state=int(seed))
    return np.asarray([partition[v] for v in range(num_nodes)], np.int64)


def louvain_split(graph: Graph, num_clients: int, seed: int = 0, delta: int = 20
                  ) -> list[np.ndarray]:
    """FederatedScope's ``LouvainSplitter``: node ids of each client."""
    num_nodes = len(graph.y)
    if not 1 <= num_clients <= num_nodes:
        raise FljaxError(f"num_clients must be in [1, {num_nodes}] (the graph's nodes), got "
                         f"{num_clients}")
    communities = louvain_communities(num_nodes, graph.senders, graph.receivers, seed)
    max_piece = max(num_nodes // num_clients - delta, 1)
    most = num_nodes // num_clients + delta
    # FederatedScope's order: each community's last piece (its nodes after the cut ones), the
    # communities in order of their smallest node (its dict of them fills in node order), then
    # the cut pieces of max_piece nodes in the order they were cut; a stable sort, largest first
    labels, first = np.unique(communities, return_index=True)
    kept, cut = [], []
    for c in labels[np.argsort(first)]:
        members = np.flatnonzero(communities == c)
        while len(members) > max_piece:
            cut.append(members[:max_piece])
            members = members[max_piece:]
        kept.append(members)
    pieces = sorted(kept + cut, key=len, reverse=True)
    clients, client = [[] for _ in range(num_clients)], 0
    for piece in pieces:
        for _ in range(num_clients):
            if len(clients[client]) + len(piece) <= most:
                break
            client = (client + 1) % num_clients
        clients[client] += piece.tolist()
        client = (client + 1) % num_clients
    if any(not c for c in clients):
        raise FljaxError(f"the Louvain split leaves a client empty; use fewer than {num_clients} "
                         f"clients")
    return [np.sort(np.asarray(c)) for c in clients]


def node_splits(labels: np.ndarray, train_per_class: int, num_val: int, seed: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Planetoid's random split (PyG ``split='random'``, FederatedScope's for PubMed): per class
    ``train_per_class`` training nodes, then ``num_val`` validation nodes of the rest, the
    remaining nodes test. Returns three boolean masks."""
    rng = np.random.default_rng(seed)
    train = np.zeros(len(labels), bool)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        train[rng.permutation(members)[:train_per_class]] = True
    rest = rng.permutation(np.flatnonzero(~train))
    val = np.zeros(len(labels), bool)
    val[rest[:num_val]] = True
    return train, val, ~train & ~val


def user_node_splits(parts: list[np.ndarray], num_nodes: int, val_fraction: float,
                     test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each client's own node split (FedDecay's per-user train / val / test): of client c's
    n_c nodes, round(val_fraction n_c) validation and round(test_fraction n_c) test nodes (at
    least one each when the fraction is > 0) drawn at random, the rest training. Three masks."""
    rng = np.random.default_rng([seed, 1])
    masks = np.zeros((3, num_nodes), bool)
    for part in parts:
        nodes = rng.permutation(part)
        n_val, n_test = held_out(len(nodes), val_fraction), held_out(len(nodes), test_fraction)
        masks[1, nodes[:n_val]] = True
        masks[2, nodes[n_val:n_val + n_test]] = True
        masks[0, nodes[n_val + n_test:]] = True
    return masks[0], masks[1], masks[2]


def federated_graph_dataset(graph: Graph, num_clients: int, *, seed: int = 0,
                            split: tuple[int, int] = SPLITS["pubmed"], delta: int = 20,
                            user_split: tuple[float, float] | None = None
                            ) -> tuple[Dataset, np.ndarray]:
    """(Dataset with one example per client, validation labels [C, Vmax]). Example c is client
    c's subgraph (the edges between its nodes), padded to the largest client: x is a dict of
    ``nodes`` [C, Vmax, F], ``senders``/``receivers`` [C, Emax] (local ids), ``edge_mask``
    [C, Emax] and ``node_mask`` [C, Vmax]; y_train / y_test [C, Vmax] hold the labels of the
    training / test nodes and -1 elsewhere. Users are the clients (partition natural).

    ``user_split`` = (val fraction, test fraction): each client's nodes split on their own
    (``user_node_splits``) instead of Planetoid's global split, for per-user evaluation and new
    users (FedDecay's Tables 3-4 on PubMed): the training data hold three copies of each
    client's subgraph, labelled on its train, val and test nodes (``Dataset.role_train`` 0, 1,
    2), so each user's split is a split of its examples; the test data are the subgraphs
    labelled on their test nodes."""
    parts = louvain_split(graph, num_clients, seed, delta)
    train, val, test = (node_splits(graph.y, *split, seed) if user_split is None else
                        user_node_splits(parts, len(graph.y), *user_split, seed))
    v_max = max(len(p) for p in parts)
    local = np.full(len(graph.y), -1)
    for p in parts:
        local[p] = np.arange(len(p))
    owner = np.empty(len(graph.y), int)
    for c, p in enumerate(parts):
        owner[p] = c
    inside = owner[graph.senders] == owner[graph.receivers]
    edges = [np.flatnonzero(inside & (owner[graph.senders] == c)) for c in range(num_clients)]
    e_max = max(1, max(len(e) for e in edges))
    x = {"nodes": np.zeros((num_clients, v_max, graph.x.shape[1]), np.float32),
         "senders": np.zeros((num_clients, e_max), np.int32),
         "receivers": np.zeros((num_clients, e_max), np.int32),
         "edge_mask": np.zeros((num_clients, e_max), np.float32),
         "node_mask": np.zeros((num_clients, v_max), np.float32)}
    labels = {name: np.full((num_clients, v_max), -1, np.int32) for name in ("train", "val", "test")}
    for c, (p, e) in enumerate(zip(parts, edges)):
        x["nodes"][c, :len(p)] = graph.x[p]
        x["node_mask"][c, :len(p)] = 1.0
        x["senders"][c, :len(e)] = local[graph.senders[e]]
        x["receivers"][c, :len(e)] = local[graph.receivers[e]]
        x["edge_mask"][c, :len(e)] = 1.0
        for name, mask in (("train", train), ("val", val), ("test", test)):
            labels[name][c, :len(p)] = np.where(mask[p], graph.y[p], -1)
    users = np.arange(num_clients, dtype=np.int32)
    if user_split is None:
        return Dataset("graph", x, labels["train"], x, labels["test"], graph.num_classes,
                       users, users), labels["val"]
    copies = {k: np.repeat(v, 3, axis=0) for k, v in x.items()}         # client-major
    by_role = np.stack([labels["train"], labels["val"], labels["test"]], axis=1)
    return Dataset("graph", copies, by_role.reshape(3 * num_clients, v_max), x, labels["test"],
                   graph.num_classes, np.repeat(users, 3), users,
                   np.tile(np.arange(3, dtype=np.int8), num_clients)), labels["val"]
