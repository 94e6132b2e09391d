"""Evaluation-time probes: the global model on the training set, and the mean of every client's
latest local model.

* ``train_evaluation()``: the global model's loss and accuracy over every example the training
  clients hold (``global_train_loss``, ``global_train_accuracy``): FedGA / GradAlign (Dandi, Barba
  and Jaggi, AAAI 2022) Figure 8's train accuracy, FedDyn as initialization (Anonymous, 2024) Figure
  4b's "training loss of the global model for the entire training data", and with the test scores
  the generalization gap of FedInit's excess risk. An example a split gives to several clients
  counts once per client, as the federated objective sum_k (n_k / n) f_k weighs it. Costs one
  forward pass over the training set per evaluation, nothing in the round.
* ``all_model()``: the FedDyn and FedBug code's ``all_model``, the unweighted mean over ALL N
  clients of each client's latest local model y_k,K (the initial model for a client never
  sampled, as the FedDyn code initializes ``clnt_params_list``), scored on the test set
  (``all_model/accuracy``, ``all_model/loss``). Memory: one model per client (N x params).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fljax.models.evaluate import make_evaluator
from fljax.probes.base import ClientView, EvalView, Probe, stacked


def train_evaluation(batch_size: int = 1024) -> Probe:
    """The first evaluation model (the global one) scored on the training clients' examples."""
    evaluators = {}

    def evaluate(view: EvalView) -> dict[str, float]:
        key = id(view.data)
        if key not in evaluators:
            index = np.asarray(view.data.index)
            evaluators.clear()
            examples = jax.tree.map(lambda a: np.asarray(a)[index], view.data.x)
            evaluators[key] = make_evaluator(view.model, examples,
                                             np.asarray(view.data.y)[index], batch_size)
        params = next(iter(view.algorithm.eval_models(view.state.params,
                                                      view.state.server_state).values()))
        scores = evaluators[key](params)
        return {"global_train_loss": float(scores["loss"]),
                "global_train_accuracy": float(scores["accuracy"])}

    return Probe(name="train_evaluation", evaluate=evaluate)


def all_model() -> Probe:
    """Test scores of mean_k y_k,K over all N clients' latest local models."""

    def init(params, num_clients):
        return (), stacked(num_clients, params)

    def client(view: ClientView):
        return view.end, ()

    def evaluate(view: EvalView) -> dict[str, float]:
        latest = view.probe_state[1]
        mean = jax.tree.map(lambda a: jnp.mean(a, axis=0).astype(a.dtype), latest)
        scores = view.evaluate(mean)
        return {"all_model/accuracy": float(scores["accuracy"]),
                "all_model/loss": float(scores["loss"])}

    return Probe(name="all_model", init=init, client=client, evaluate=evaluate)
