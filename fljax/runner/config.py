"""The experiment configuration read by the CLI and experiment scripts (library code never reads it)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import math
import os
import re
from typing import Any, Callable, NamedTuple

import optax

from fljax import registry
from fljax.runner.arguments import check_kwargs, settable
from fljax.core.asynchronous import Asynchrony, check_asynchrony
from fljax.population.clock import Clock, make_clock
from fljax.data.augment import AUGMENTATIONS
from fljax.data.noise import CLASS_NOISE_READINGS
from fljax.core.engine import AGGREGATIONS, PARTICIPATIONS
from fljax.data.users import held_out
from fljax.errors import FljaxError
from fljax.fielddocs import list_fields
from fljax.models import CONV_IMPLS, MODEL_NAMES
from fljax.privacy import ACCOUNTANTS, accountant, calibrate, default_delta, epsilon
from fljax.population.stragglers import Deadline, check_deadline

PARTITIONS = ("iid", "dirichlet", "dirichlet_balanced", "classes", "natural")
ALGORITHMS = registry.BUILTIN_ALGORITHMS   # fljax's own; a user's enter by fljax.registry
FULL_BATCH = ("fedsgd", "lbsgd")   # one local step on the whole local dataset
# Wrappers over any algorithm, applied innermost first: FedBug, FedDecay, relaxed init (+RI),
# FedBN, robust aggregation, Byzantine clients (outside robust: the rule sees their attacks),
# uplink compression (the robust rule sees what the server decodes), user-level DP (outermost:
# it privatizes what the others send, and clips what compress encodes; it refuses robust and
# byzantine, whose aggregate is no noised sum).
WRAPPERS = registry.BUILTIN_WRAPPERS
MAX_SEED = 2**32 - 1   # jax.random.PRNGKey keeps 32 bits of a seed (without x64)
# The --help groups of the config fields, in order.
GROUPS = ("data", "model", "algorithm", "local training", "server", "privacy", "time",
          "evaluation",
          "output", "run")
RENAMED = {"alpha": "dirichlet_alpha"}   # old config key -> its current name
JSON_FIELDS = ("wrappers", "switch_when", "probe_args", "clock", "deadline", "asynchrony")
COMPUTE_DTYPES = ("float32", "bfloat16")
# The two ways to size local work: a number for one (a flag, a config file, a sweep level, --set or
# a grid key) turns the other off, unless the same values name both.
LOCAL_WORK = ("local_steps", "local_epochs")

# Config fields that may change when a run resumes: they do not change the experiment itself (so
# they are not part of its default run directory's name either).
RESUMABLE_CHANGES = frozenset({"rounds", "eval_every", "out_dir", "checkpoint_every",
                               "keep_checkpoints", "client_chunk", "unroll", "num_devices",
                               "target_accuracy", "coordinator_address", "num_processes",
                               "process_id", "download",
                               "imports"})   # where registered names came from (record)


def option(default: Any, group: str, text: str, *aliases: str):
    """A config field with its group and one-line help ``text`` for ``fljax --help``;
    ``aliases``: older flag names that still work."""
    return dataclasses.field(default=default,
                             metadata={"group": group, "help": text, "aliases": aliases})


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """Every knob of one federated experiment. Defaults: the README's main job (whose config
    file also names its run directory, runs/digits_fedavg). Each field's metadata holds its
    --help group and text."""

    dataset: str = option("digits", "data", "'digits' (embedded); 'mnist1d', 'mnist1d_N', "
                          "'synthetic_ALPHA_BETA', 'synthetic_iid' (generated); "
                          "'leaf/femnist', 'leaf/shakespeare', 'leaf/sent140', 'leaf/synthetic' "
                          "(LEAF JSON in --data-dir, natural users); 'tff_emnist', "
                          "'tff_emnist_digits', 'tff_shakespeare', 'tff_cifar100', "
                          "'tff_cifar100_coarse' (TensorFlow Federated's .h5 files in the "
                          "data directory, natural users); 'mnist', 'fashion_mnist', "
                          "'emnist_SPLIT' (IDX files in the data directory; fashion_mnist "
                          "without one: Debian's package's files); a tfds name prepared there; "
                          "or an .npz file holding x_train, y_train, "
                          "x_test, y_test (and client_id_train, optionally client_id_test: users, "
                          "split with --partition natural)")
    data_dir: str | None = option(None, "data", "directory of the dataset's files: prepared "
                                  "tfds data, IDX files, TFF .h5 files or a LEAF dataset (fljax "
                                  "downloads nothing unless --download)")
    download: bool = option(False, "data", "let tensorflow-datasets download and prepare a "
                            "tfds dataset missing from --data-dir (network; off: a missing "
                            "dataset is an error saying how to prepare it)")
    partition: str = option("dirichlet", "data", "how the training set is split among the "
                            f"clients: one of {', '.join(PARTITIONS)} (natural: one client per "
                            "user, for datasets with users)")
    dirichlet_alpha: float = option(0.3, "data", "Dirichlet concentration of the label skew "
                                    "(dirichlet, dirichlet_balanced); smaller is more skewed. "
                                    "FedDyn's alpha goes in --algorithm-args", "--alpha")
    sample_users: int = option(0, "data", "LEAF datasets: keep this many of the prepared "
                               "data's users, a fixed seeded draw (pFL-Bench's FEMNIST: 200 "
                               "writers); 0: every user")
    min_size: int = option(10, "data", "dirichlet: redraw until every client has at least this "
                           "many examples")
    replacement: bool = option(False, "data", "dirichlet_balanced: draw examples with "
                               "replacement (FedInit, FL-Simulator)")
    classes_per_client: int = option(2, "data", "classes: the number of classes each client "
                                     "holds")
    num_clients: int = option(20, "data", "number of clients")
    client_noise: float = option(0.0, "data", "FedInit's client-based bias: client i's images "
                                 "have channel c scaled by 1 + sigma e_ic, e ~ N(0, 1) drawn per "
                                 "run (fljax.data.noise; 0: none)")
    class_noise: float = option(0.0, "data", "FedInit's category-based bias: client i's "
                                "training images of class k brightened by sigma b_ik, b ~ N(0, "
                                "1) drawn per run (0: none; class_noise_reading)")
    class_noise_reading: str = option("per_client", "data", "class_noise's reading: per_client "
                                      "(an offset per client and class, on the clients' training "
                                      "copies only) or shared (one offset per class, the same "
                                      "for every client, on training, validation and test images)")
    augment: str = option("none", "data", "augmentation of the training batches: none, "
                          "flip_crop (the FedDyn code's CIFAR flip + pad-4 crop) or flip (flips "
                          "only: FedBug on Tiny-ImageNet)")
    model: str = option("mlp", "model", f"one of {', '.join(MODEL_NAMES)}; or your own: an "
                        "import path 'package.module:factory' or a name given to "
                        "fljax.register_model")
    pretrained: str | None = option(None, "model", "a local pretrained checkpoint the model "
                                    "starts from: BERT weights (.npz of HuggingFace names) for "
                                    "model bert_tiny")
    init_from: str | None = option(None, "model", "start from the global model of another "
                                   "run's newest checkpoint (that run's --out-dir); its params "
                                   "must have this model's shapes")
    init_reset: str = option("", "model", "with --init-from: top-level layers (comma-separated, "
                             "e.g. 'Dense_2') that keep their own initialization instead, e.g. a "
                             "classifier whose number of classes differs")
    conv_impl: str | None = option(None, "model", f"convolution: {' or '.join(CONV_IMPLS)}; "
                                   "unset: im2col (the faster on CPU and GPU: BENCHMARKS.md)")
    algorithm: str = option("fedavg", "algorithm", "the federated algorithm (`fljax algorithms` "
                            "lists them with their hyperparameters); or your own: an import "
                            "path 'package.module:factory' or a name given to "
                            "fljax.register_algorithm")
    algorithm_args: str = option("{}", "algorithm", "its hyperparameters, a JSON object, e.g. "
                                 "'{\"alpha\": 0.1}' for feddyn")
    switch_to: str | None = option(None, "algorithm", "continue with this algorithm from round "
                                   "--switch-at on (FedDyn as initialization: --algorithm feddyn "
                                   "--switch-to fedavg)")
    switch_at: int = option(0, "algorithm", "the round --switch-to takes over")
    switch_lr: float | None = option(None, "algorithm", "the local lr of --switch-to (unset: "
                                     "--lr); an x0.1 step at the switch (Figure 7 of FedDyn as "
                                     "initialization): --lr 0.1 --switch-lr 0.01")
    switch_args: str = option("{}", "algorithm", "hyperparameters of --switch-to, a JSON object")
    switch_carry_state: bool = option(False, "algorithm", "--switch-to continues from the first "
                                      "algorithm's server and client state (FedDyn -> FedDyn w/o "
                                      "h keeps h_k, Figure 12); both states must have the same "
                                      "structure")
    switch_when: str = option("{}", "algorithm", "switch to --switch-to the round after "
                              "Proposition 1's condition holds (a JSON object of "
                              "probes.switching_criterion's arguments, e.g. '{\"zeta\": 0.1, "
                              "\"smoothness\": \"estimate\", \"optimum\": \"centralized\"}'; "
                              "--switch-at unused)")
    wrappers: str = option("{}", "algorithm", "wrappers over the algorithm, a JSON object of "
                           f"their arguments by name ({', '.join(WRAPPERS)}), e.g. "
                           "'{\"relaxed_init\": {\"beta\": 0.1}}' (+RI)")
    server_optimizer: str = option("sgd", "server", "any optax optimizer taking learning_rate "
                                   "(sgd, adam, yogi, ...), applied to the averaged update")
    server_optimizer_args: str = option("{}", "server", "its keyword arguments, a JSON object, "
                                        "e.g. '{\"momentum\": 0.9}' (FedAvgM)")
    server_lr: float = option(1.0, "server", "server learning rate")
    lr: float = option(0.05, "local training", "local learning rate")
    lr_decay: float = option(1.0, "local training", "per-round decay of the local learning "
                             "rate: lr * lr_decay**t")
    lr_decay_offset: float | None = option(None, "local training", "inverse-time decay of the "
                                           "local learning rate, lr * d / (t + d) with this d "
                                           "(FedDecay's Theorems 1-2); unset: none")
    momentum: float = option(0.0, "local training", "local SGD momentum")
    weight_decay: float = option(0.0, "local training", "local SGD weight decay")
    clip_norm: float | None = option(None, "local training", "clip each local gradient to this "
                                     "norm; unset: no clipping")
    aggregation: str | None = option(None, "server", "weights of the clients' updates: examples "
                                     "(by their number of examples) or uniform; unset: the "
                                     "algorithm's paper's (`fljax algorithms NAME` says which; "
                                     "examples where it declares none)")
    rounds: int = option(200, "server", "communication rounds")
    clients_per_round: int = option(10, "server", "clients per round (with --participation "
                                    "bernoulli: the expected number)")
    participation: str = option("uniform", "server", "uniform: clients_per_round distinct "
                                "clients; bernoulli: each client joins with probability "
                                "clients_per_round / num_clients (the FedDyn code)")
    local_steps: int | None = option(None, "local training", "local steps per round (instead of "
                                     "--local-epochs)")
    local_epochs: int | None = option(2, "local training", "local epochs per round (instead of "
                                      "--local-steps)")
    batch_size: int = option(16, "local training", "local batch size; 0: each client's whole "
                             "local dataset")
    target_epsilon: float | None = option(None, "privacy", "with the dp wrapper: calibrate its "
                                          "noise_multiplier so that the planned rounds spend this "
                                          "epsilon (instead of giving noise_multiplier)")
    dp_delta: float | None = option(None, "privacy", "with the dp wrapper: the delta of the "
                                    "(epsilon, delta) spent; default N^-1.1 for N training users")
    accountant: str = option("rdp", "privacy", f"with the dp wrapper: dp_accounting's accountant, "
                             f"{' or '.join(ACCOUNTANTS)} (pld: Bernoulli participation only)")
    clock: str = option("{}", "time", "simulated client durations (fljax.population.clock), a JSON object: "
                        "'{\"sigma\": 1.0, \"jitter\": 0.2}' (lognormal step times) or "
                        "'{\"trace\": \"FILE\"}' (a JSON list of step times, one per client); "
                        "{}: no clock")
    deadline: str = option("{}", "time", "with --clock, a synchronous round's deadline "
                           "(fljax.population.stragglers), a JSON object: seconds, stragglers (drop or "
                           "partial), dropout, over_selection")
    asynchrony: str = option("{}", "time", "with --clock, asynchronous training "
                             "(fljax.core.asynchronous), a JSON object: rule (fedbuff or fedasync), "
                             "in_flight, buffer, staleness (constant, polynomial, hinge), a, b, "
                             "alpha; a round is then one server step")
    new_users: float = option(0.0, "evaluation", "personalized evaluation: share of the clients "
                              "held out of training (new users)")
    user_val_fraction: float = option(0.0, "evaluation", "share of each user's examples kept for "
                                      "validation")
    user_test_fraction: float = option(0.0, "evaluation", "share of each user's examples kept "
                                       "for test; > 0 turns the personalized evaluation on")
    finetune_steps: int = option(0, "evaluation", "SGD steps each user fine-tunes the global "
                                 "model before it is scored")
    finetune_lr: float = option(0.01, "evaluation", "learning rate of that fine-tuning "
                                "(pFL-Bench FEMNIST: 5 steps at 0.01)")
    probes: str = option("", "evaluation", "probes measured during the run, comma-separated "
                         "fljax.probes names, e.g. pseudo_gradient_diversity,cosine_previous")
    probe_args: str = option("{}", "evaluation", "their arguments, a JSON object by probe, e.g. "
                             "'{\"interaction_tensor\": {\"rounds\": [50, 100]}}'")
    target_accuracy: float | None = option(None, "evaluation", "the results table gives the "
                                           "rounds, bytes, FLOPs and seconds to reach this test "
                                           "accuracy")
    validation_fraction: float = option(0.0, "evaluation", "share of the training examples held "
                                        "out of the clients; evaluations then log val_accuracy "
                                        "and val_loss (sweeps select grids on it)")
    eval_every: int = option(20, "evaluation", "rounds between evaluations on the test set (and "
                             "one at the end)")
    seed: int = option(0, "run", "seed of the split, the initial model, client sampling and "
                       "batches")
    out_dir: str | None = option(None, "output", "run directory (metrics.jsonl, TensorBoard "
                                 "events, checkpoints, config.json); a run there resumes. Unset: "
                                 "runs/DATASET_ALGORITHM_HASH, HASH a digest of the values that "
                                 "define the experiment (all but --rounds and the other output "
                                 "and run settings a resume may change), so another experiment "
                                 "gets another directory and more --rounds continue this one")
    checkpoint_every: int = option(20, "output", "rounds between checkpoints (and one at the "
                                   "end)")
    keep_checkpoints: int = option(3, "output", "how many recent checkpoints to keep")
    client_chunk: int | None = option(None, "run", "clients trained side by side at a time; "
                                      "unset: 1 on CPU, the whole per-device cohort elsewhere")
    unroll: int = option(1, "run", "local steps per iteration of the compiled loop over a "
                         "client's steps (the same results; larger can be faster on GPU)")
    compute_dtype: str = option("float32", "run", "dtype of the model's forward and backward "
                                f"passes: {' or '.join(COMPUTE_DTYPES)} (parameters, gradients "
                                "and optimizer state stay float32)")
    num_devices: int = option(1, "run", "devices the population (client data and per-client "
                              "state) and each cohort are sharded over, across all processes")
    coordinator_address: str | None = option(None, "run", "multi-process run: process 0's "
                                             "'host:port'")
    num_processes: int = option(1, "run", "multi-process run: the number of processes")
    process_id: int = option(0, "run", "multi-process run: this process's number, from 0")

    def validate(self) -> "ExperimentConfig":
        """Raise FljaxError naming the first bad value; return self when all are allowed."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise FljaxError(f"{field.name} must be a finite number, got {value}")
        if not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise FljaxError(f"seed must be an integer in [0, {MAX_SEED}], got {self.seed!r}")
        positive = dict(num_clients=self.num_clients, clients_per_round=self.clients_per_round,
                        rounds=self.rounds, eval_every=self.eval_every,
                        num_devices=self.num_devices, checkpoint_every=self.checkpoint_every,
                        keep_checkpoints=self.keep_checkpoints, unroll=self.unroll)
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise FljaxError(f"{name} must be an integer >= 1, got {value!r}")
        if self.lr <= 0:
            raise FljaxError(f"lr must be > 0, got {self.lr}")
        if self.server_lr <= 0:
            raise FljaxError(f"server_lr must be > 0, got {self.server_lr}")
        if not 0 < self.lr_decay <= 1:
            raise FljaxError(f"lr_decay must be in (0, 1], got {self.lr_decay}")
        if self.lr_decay_offset is not None and not 0 < self.lr_decay_offset < float("inf"):
            raise FljaxError(f"lr_decay_offset must be > 0 and finite (or unset), got "
                             f"{self.lr_decay_offset}")
        if self.momentum < 0 or self.momentum >= 1:
            raise FljaxError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise FljaxError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise FljaxError(f"clip_norm must be > 0 or unset, got {self.clip_norm}")
        if self.min_size < 0:
            raise FljaxError(f"min_size must be >= 0, got {self.min_size}")
        if self.dirichlet_alpha <= 0:
            raise FljaxError(f"dirichlet_alpha must be > 0, got {self.dirichlet_alpha}")
        if self.batch_size < 0:
            raise FljaxError(f"batch_size must be >= 1, or 0 for the full local dataset, got "
                             f"{self.batch_size}")
        for name in ("new_users", "user_val_fraction", "user_test_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise FljaxError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.user_val_fraction + self.user_test_fraction >= 1:
            raise FljaxError(f"user_val_fraction + user_test_fraction must be < 1, got "
                             f"{self.user_val_fraction} + {self.user_test_fraction}")
        if self.user_test_fraction == 0 and (self.new_users or self.user_val_fraction
                                             or self.finetune_steps):
            raise FljaxError("new_users, user_val_fraction and finetune_steps need "
                             "user_test_fraction > 0 (users are scored on their test split), "
                             "got user_test_fraction=0")
        if not isinstance(self.finetune_steps, int) or self.finetune_steps < 0:
            raise FljaxError(f"finetune_steps must be an integer >= 0, got "
                             f"{self.finetune_steps!r}")
        if self.finetune_lr <= 0:
            raise FljaxError(f"finetune_lr must be > 0, got {self.finetune_lr}")
        if self.participation not in PARTICIPATIONS:
            raise FljaxError(f"participation must be one of {PARTICIPATIONS}, got "
                             f"{self.participation!r}")
        if self.augment not in AUGMENTATIONS:
            raise FljaxError(f"augment must be one of {AUGMENTATIONS}, got {self.augment!r}")
        if self.partition not in PARTITIONS:
            raise FljaxError(f"partition must be one of {PARTITIONS}, got {self.partition!r}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise FljaxError(f"compute_dtype must be one of {COMPUTE_DTYPES}, got "
                             f"{self.compute_dtype!r}")
        if self.conv_impl is not None and self.conv_impl not in CONV_IMPLS:
            raise FljaxError(f"conv_impl must be one of {CONV_IMPLS} or unset, got "
                             f"{self.conv_impl!r}")
        if self.model not in MODEL_NAMES:
            registry.lookup("model", self.model, known=MODEL_NAMES)
        registry.lookup("algorithm", self.algorithm)
        if self.aggregation is not None and self.aggregation not in AGGREGATIONS:
            raise FljaxError(f"aggregation must be one of {AGGREGATIONS} or unset (the "
                             f"algorithm's paper's), got {self.aggregation!r}")
        if self.clients_per_round > self.num_clients:
            raise FljaxError(f"clients_per_round ({self.clients_per_round}) must be <= "
                             f"num_clients ({self.num_clients})")
        if (self.local_steps is None) == (self.local_epochs is None):
            raise FljaxError("set exactly one of local_steps and local_epochs, got "
                             f"local_steps={self.local_steps}, local_epochs={self.local_epochs}")
        work = self.local_steps if self.local_steps is not None else self.local_epochs
        if work < 1:
            raise FljaxError(f"local_steps / local_epochs must be >= 1, got {work}")
        if self.switch_to is not None:
            registry.lookup("algorithm", self.switch_to)
        if self.switch_at < 0:
            raise FljaxError(f"switch_at must be >= 0, got {self.switch_at}")
        for name in ("client_noise", "class_noise"):
            if getattr(self, name) < 0:
                raise FljaxError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.sample_users < 0:
            raise FljaxError(f"sample_users must be >= 0 (0: every user), got {self.sample_users}")
        if self.class_noise_reading not in CLASS_NOISE_READINGS:
            raise FljaxError(f"class_noise_reading must be one of {CLASS_NOISE_READINGS}, got "
                             f"{self.class_noise_reading!r}")
        if self.class_noise > 0 and self.class_noise_reading == "per_client" and \
                self.user_test_fraction > 0:
            raise FljaxError(f"class_noise (reading per_client) copies each client's training "
                             f"images; per-user validation and test sets (user_test_fraction="
                             f"{self.user_test_fraction}) are not copied: use one of the two, or "
                             f"class_noise_reading shared")
        if self.client_noise > 0 and self.user_test_fraction > 0:
            raise FljaxError(f"client_noise copies each client's training images; per-user "
                             f"validation and test sets (user_test_fraction="
                             f"{self.user_test_fraction}) are not copied: use one of the two")
        if self.switch_lr is not None and not 0 < self.switch_lr < float("inf"):
            raise FljaxError(f"switch_lr must be > 0 and finite, or unset, got {self.switch_lr}")
        if self.switch_lr is not None and self.switch_to is None:
            raise FljaxError(f"switch_lr needs switch_to (the algorithm it is the lr of), got "
                             f"switch_lr={self.switch_lr} and no switch_to")
        if self.init_from is not None and self.pretrained is not None:
            raise FljaxError(f"set one of init_from and pretrained (both give the initial "
                             f"model), got init_from={self.init_from!r}, "
                             f"pretrained={self.pretrained!r}")
        if self.init_reset and self.init_from is None:
            raise FljaxError(f"init_reset needs init_from (the run whose params it keeps), got "
                             f"init_reset={self.init_reset!r}")
        if not 0 <= self.validation_fraction < 1:
            raise FljaxError(f"validation_fraction must be in [0, 1), got "
                             f"{self.validation_fraction}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise FljaxError(f"target_accuracy must be in (0, 1] or unset, got "
                             f"{self.target_accuracy}")
        self.options                # the JSON-valued fields, parsed and checked
        if "dp" not in self.options.wrappers:
            for name in ("target_epsilon", "dp_delta"):
                if getattr(self, name) is not None:
                    raise FljaxError(f"{name} needs the dp wrapper (--wrappers '{{\"dp\": "
                                     f"{{...}}}}'), got {name}={getattr(self, name)}")
        return self

    def run_dir(self) -> str:
        """The run directory: ``out_dir`` if set, else ``runs/DATASET_ALGORITHM_HASH``
        (``default_run_dir``)."""
        return self.out_dir if self.out_dir is not None else default_run_dir(self)

    def users(self) -> int:
        """The number of training users: the clients less the new users held out."""
        if self.user_test_fraction == 0:
            return self.num_clients
        return self.num_clients - held_out(self.num_clients, self.new_users)

    def delta(self) -> float:
        """The delta of a DP run's (epsilon, delta): --dp-delta, else N^-1.1."""
        return self.dp_delta if self.dp_delta is not None else default_delta(self.users())

    def privacy_spent(self, rounds: int) -> dict[str, float]:
        """{'epsilon', 'delta', 'noise_multiplier'} of ``rounds`` rounds of a DP run ({} without
        dp): a function of the round count a checkpoint holds, so a resumed run reports what an
        uninterrupted one does."""
        args = self.wrapper_args.get("dp")
        if args is None:
            return {}
        delta = self.delta()
        z = args["noise_multiplier"]
        return {"epsilon": epsilon(z, rounds, delta, cohort_size=self.clients_per_round,
                                   num_clients=self.users(), participation=self.participation,
                                   accountant_name=self.accountant),
                "delta": delta, "noise_multiplier": z}

    @functools.cached_property
    def options(self) -> "Options":
        """The JSON-valued fields parsed and checked against the factories they are for (computed
        once; a bad value is a one-line FljaxError naming it). With --target-epsilon the dp
        wrapper's noise_multiplier is not among them yet: ``wrapper_args`` calibrates it."""
        return parse_options(self)

    @functools.cached_property
    def wrapper_args(self) -> dict[str, dict[str, Any]]:
        """The wrappers' arguments (``options.wrappers``, in WRAPPERS order) as the run uses
        them: with --target-epsilon, the dp wrapper's noise_multiplier calibrated so that the
        planned rounds spend it (``fljax.privacy.calibrate``; computed once, at the first read,
        so that a bad value or a resume that changes the rounds is refused before it)."""
        wrappers = self.options.wrappers
        if self.target_epsilon is None or "dp" not in wrappers:
            return wrappers
        z = calibrate(self.target_epsilon, self.rounds, self.delta(),
                      cohort_size=self.clients_per_round, num_clients=self.users(),
                      participation=self.participation, accountant_name=self.accountant)
        return {**wrappers, "dp": {**wrappers["dp"], "noise_multiplier": z}}

    def probe_names(self) -> list[str]:
        """The names in ``probes``, in order."""
        return [name.strip() for name in self.probes.split(",") if name.strip()]

    def replace(self, **changes) -> "ExperimentConfig":
        """A copy with ``changes`` (old names of renamed fields accepted), each checked against
        the field's type; a number for local_steps or local_epochs turns the other off
        (``one_local_work``)."""
        changes = one_local_work(current_names(changes))
        fields = {f.name: f.type for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise FljaxError(f"unknown config key(s) {unknown}; allowed: {sorted(fields)}")
        for name, value in changes.items():
            changes[name] = _coerce(name, fields[name], value)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved(self) -> "ExperimentConfig":
        """This config with what it leaves to the algorithm filled in: ``aggregation`` unset is
        the one the algorithm declares as its paper's (``fljax.registry.declare``), else
        'examples'. What a run trains, records in its directory and reports. Its ``out_dir`` is
        this config's ``run_dir()`` (the name comes from the values as given)."""
        if self.aggregation is not None and self.out_dir is not None:
            return self
        resolved = dataclasses.replace(self, out_dir=self.run_dir(), aggregation=resolved_values(
            {"algorithm": self.algorithm, "aggregation": self.aggregation})["aggregation"])
        for parsed in ("options", "wrapper_args"):   # parsed already (wrapper_args: a DP
            if parsed in self.__dict__:                 # calibration), and neither field
                resolved.__dict__[parsed] = self.__dict__[parsed]   # changes what they are
        return resolved

    def imports(self) -> dict[str, dict[str, str]]:
        """{kind: {name: import path}} of the registered names this config uses (its algorithm,
        switch_to, model, dataset and probes): a run directory records them so that a resume in
        another process imports them again (``fljax.registry.import_recorded``)."""
        return registry.recorded_paths({
            "algorithm": [self.algorithm] + ([self.switch_to] if self.switch_to else []),
            "model": [self.model], "dataset": [self.dataset], "probe": self.probe_names()})

    def record(self) -> dict[str, Any]:
        """What a run directory's config.json and checkpoints hold: ``to_dict`` and, if it uses
        registered names, their import paths under "imports"."""
        imports = self.imports()
        return {**self.to_dict(), **({"imports": imports} if imports else {})}


ExperimentConfig.__doc__ = list_fields(ExperimentConfig)     # help() lists every field's meaning


def experiment_hash(config: ExperimentConfig) -> str:
    """8 hex digits of a digest of the values of ``config`` that define its experiment: those
    that differ from the defaults (a field added to fljax later changes no name), but none of
    RESUMABLE_CHANGES, so that a resume with more --rounds keeps the directory; the rounds count
    only when --target-epsilon calibrates the noise to them."""
    defaults = ExperimentConfig().to_dict()
    values = {key: value for key, value in config.to_dict().items()
              if value != defaults[key] and (key not in RESUMABLE_CHANGES or (
                  key == "rounds" and config.target_epsilon is not None))}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8]


def default_run_dir(config: ExperimentConfig) -> str:
    """``runs/DATASET_ALGORITHM_HASH``: the dataset name kept to [A-Za-z0-9._-] (a path such as
    'leaf/femnist' or '~/data/x.npz' becomes 'leaf_femnist', 'data_x.npz'), HASH
    ``experiment_hash``."""
    dataset = re.sub(r"[^A-Za-z0-9._-]", "_", config.dataset)[-40:].strip("._-") or "data"
    algorithm = re.sub(r"[^A-Za-z0-9._-]", "_", config.algorithm)[-40:]  # an import path too
    return os.path.join("runs", f"{dataset}_{algorithm}_{experiment_hash(config)}")


def resolved_values(values: dict[str, Any]) -> dict[str, Any]:
    """Config ``values`` (a dict, e.g. a checkpoint's) with an unset aggregation filled in as
    ``ExperimentConfig.resolved`` does: compared that way, a config as given and the resolved
    one its run saved are the same experiment."""
    if values.get("aggregation") is not None or "algorithm" not in values:
        return values
    settings = registry.declared(registry.lookup("algorithm", values["algorithm"]))
    return {**values, "aggregation": settings.get("aggregation", "examples")}


def current_names(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (config keys) with the old names of renamed fields (RENAMED; config files,
    sweeps and checkpoints written before the rename) replaced by the current ones."""
    both = [old for old, new in RENAMED.items() if old in values and new in values]
    if both:
        raise FljaxError(f"{both[0]} is the old name of {RENAMED[both[0]]}; give only one of "
                         f"them")
    return {RENAMED.get(key, key): value for key, value in values.items()}


def one_local_work(changes: dict[str, Any]) -> dict[str, Any]:
    """``changes`` (config keys) as they apply over earlier values: a number for one kind of
    local work (LOCAL_WORK) sets the other to None, as ``--local-steps 10`` turns the default
    ``local_epochs`` off, unless ``changes`` names both (two numbers: an error of validate)."""
    named = [key for key in LOCAL_WORK if key in changes]
    if len(named) == 1 and changes[named[0]] is not None:
        other = LOCAL_WORK[1 - LOCAL_WORK.index(named[0])]
        return {**changes, other: None}
    return changes


def json_object(name: str, text: str) -> dict[str, Any]:
    """Parse a config field holding a JSON object of keyword arguments."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise FljaxError(f"{name} must be a JSON object, got {text!r} ({e.msg})") from None
    if not isinstance(value, dict):
        raise FljaxError(f"{name} must be a JSON object, got {text!r}")
    return value


def _coerce(name: str, annotation: str, value: Any) -> Any:
    """Check ``value`` against a field annotation such as 'float | None'; ints pass as floats,
    a dict passes as its JSON text for the ``*_args`` and ``wrappers`` fields."""
    allowed = [t.strip() for t in annotation.split("|")]
    if value is None and "None" in allowed:
        return None
    if "bool" in allowed and isinstance(value, bool):
        return value
    if "int" in allowed and isinstance(value, int) and not isinstance(value, bool):
        return value
    if "float" in allowed and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if "str" in allowed and isinstance(value, str):
        return value
    if name == "probes" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    if (name.endswith("_args") or name in JSON_FIELDS) and isinstance(value, dict):  # JSON object
        return json.dumps(value)
    raise FljaxError(f"{name} must be of type {annotation}, got {value!r}")


def server_optimizer_factory(name: str):
    """The optax optimizer called ``name`` (big_vision style: by attribute, no registry)."""
    factory = getattr(optax, name, None)
    if not callable(factory) or name.startswith("_") or name in ("chain", "tree"):
        raise FljaxError(f"unknown server optimizer {name!r}; use an optax optimizer name such "
                         f"as 'sgd', 'adam', 'yogi', 'adagrad'")
    return factory


class Options(NamedTuple):
    """The JSON-valued fields of an ExperimentConfig as checked Python values."""

    algorithm_args: dict[str, Any]
    switch_args: dict[str, Any]
    switch_when: dict[str, Any]
    wrappers: dict[str, dict[str, Any]]          # in WRAPPERS order
    server_optimizer: Callable[..., optax.GradientTransformation]
    server_optimizer_args: dict[str, Any]
    probes: tuple[str, ...]
    probe_args: dict[str, dict[str, Any]]
    clock: Clock | None = None
    deadline: Deadline | None = None
    asynchrony: Asynchrony | None = None


# Probe arguments the experiment supplies (a value here stands for the experiment's own), and
# extra ones it reads: the interaction tensor's points are the first num_points test examples;
# switching_criterion's optimum and smoothness may be computed ("centralized", "estimate").
PROBE_SUPPLIED = {"interaction_tensor": ("points",), "switching_criterion": ("alpha",)}
PROBE_EXTRAS = {"interaction_tensor": {"num_points": int}}
PROBE_WORDS = {("switching_criterion", "optimum"): "centralized",
               ("switching_criterion", "smoothness"): "estimate"}


def parse_options(config: ExperimentConfig) -> Options:
    """Parse the JSON-valued fields of ``config`` and check each against its factory's
    signature (``fljax.runner.arguments``); FljaxError names the first bad one."""
    def arguments(name: str, factory: Callable, args: dict, what: str, source: str,
                  supplied: tuple[str, ...] = ()):
        parameters = settable(name, factory)
        shared_flags(f"{what} {name!r}", parameters, args, source)
        check_kwargs(f"{what} {name!r}", parameters, args, supplied)
        return args

    algorithm_args = arguments(config.algorithm, registry.lookup("algorithm", config.algorithm),
                               json_object("algorithm_args", config.algorithm_args), "algorithm",
                               "--algorithm-args")
    switch_args = json_object("switch_args", config.switch_args)
    if config.switch_to is not None:
        arguments(config.switch_to, registry.lookup("algorithm", config.switch_to), switch_args,
                  "algorithm", "--switch-args")
    switch_when = json_object("switch_when", config.switch_when)
    if switch_when and (config.switch_to is None or config.switch_at != 0):
        raise FljaxError(f"switch_when needs switch_to (the second algorithm) and no "
                         f"switch_at, got switch_to={config.switch_to!r}, "
                         f"switch_at={config.switch_at}")
    if switch_when:
        probe_arguments("switching_criterion", registry.lookup("probe", "switching_criterion"),
                        switch_when,
                        "switch_when")
    given = json_object("wrappers", config.wrappers)
    unknown = sorted(set(given) - set(WRAPPERS))
    if unknown:
        raise FljaxError(f"unknown wrapper(s) {unknown}; allowed: {list(WRAPPERS)}")
    wrappers = {}
    for name in (w for w in WRAPPERS if w in given):
        if not isinstance(given[name], dict):
            raise FljaxError(f"wrapper {name!r} takes a JSON object of arguments, got "
                             f"{given[name]!r}")
        calibrated = ()
        if name == "dp":
            check_private(config, given[name])
            calibrated = ("noise_multiplier",) if config.target_epsilon is not None else ()
        wrappers[name] = arguments(name, registry.lookup("wrapper", name), given[name],
                                   "wrapper", "--wrappers", calibrated)
    factory = server_optimizer_factory(config.server_optimizer)
    server_args = json_object("server_optimizer_args", config.server_optimizer_args)
    if "learning_rate" in server_args:
        raise FljaxError(f"server_optimizer_args sets learning_rate "
                         f"({json.dumps(server_args['learning_rate'])}), which --server-lr sets; "
                         f"give it once, as server_lr")
    check_kwargs(f"server optimizer {config.server_optimizer!r}",
                 list(inspect.signature(factory).parameters.values()), server_args,
                 supplied=("learning_rate",))
    probes = tuple(config.probe_names())
    factories = {name: registry.lookup("probe", name) for name in probes}
    probe_args = json_object("probe_args", config.probe_args)
    unused = sorted(set(probe_args) - set(probes))
    if unused:
        raise FljaxError(f"probe_args names {unused}, which are not in probes {list(probes)}")
    for name in probes:
        probe_arguments(name, factories[name], probe_args.setdefault(name, {}), "probe")
    return Options(algorithm_args, switch_args, switch_when, wrappers, factory, server_args,
                   probes, probe_args, *timing(config))


def shared_flags(what: str, parameters: list[inspect.Parameter], args: dict,
                 source: str) -> None:
    """Raise FljaxError if ``args`` (given in ``source``, e.g. --algorithm-args) set a config
    field that the factory does not take itself (server_lr, lr, momentum, ...): a setting every
    algorithm shares, whose flag sets it."""
    own = {p.name for p in parameters}
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    shared = [key for key in args if key in fields and key not in own]
    if shared:
        key = shared[0]
        field = "switch_lr" if (key, source) == ("lr", "--switch-args") else key
        raise FljaxError(f"{what} takes {key} from --{field.replace('_', '-')} ({field} in the "
                         f"config), not from {source}")


def timing(config: ExperimentConfig) -> tuple[Clock | None, Deadline | None, Asynchrony | None]:
    """The --clock, --deadline and --asynchrony objects as checked values (None when {})."""
    def given(name: str, factory: Callable, renamed: dict | None = None):
        args = json_object(name, getattr(config, name))
        if not args:
            return None
        parameters = [p for p in inspect.signature(factory).parameters.values()
                      if p.name not in (renamed or {}).values()]
        parameters += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None,
                                         annotation="str") for k in (renamed or {})]
        check_kwargs(name, parameters, args)
        return args

    clock = given("clock", make_clock, {"trace": "step_times"})
    if clock is not None:
        trace = clock.pop("trace", None)
        clock = make_clock(**clock, step_times=None if trace is None else read_trace(trace))
    deadline = given("deadline", Deadline)
    asynchrony = given("asynchrony", Asynchrony)
    if (deadline or asynchrony) and clock is None:
        raise FljaxError("deadline and asynchrony need --clock (the clients' durations)")
    return (clock, None if deadline is None else check_deadline(Deadline(**deadline)),
            None if asynchrony is None else check_asynchrony(Asynchrony(**asynchrony),
                                                             config.users()))


def read_trace(path: str) -> list[float]:
    """A trace of per-client step times: a JSON list of numbers."""
    try:
        with open(os.path.expanduser(path)) as f:
            times = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise FljaxError(f"clock trace {path!r} cannot be read as a JSON list of step times "
                         f"({e})") from None
    if not isinstance(times, list) or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) for t in times):
        raise FljaxError(f"clock trace {path!r} must hold a JSON list of numbers")
    return times


def check_private(config: ExperimentConfig, args: dict) -> None:
    """Check the dp wrapper's accounting settings, and that its noise is set once: by its
    noise_multiplier, or by --target-epsilon (``ExperimentConfig.wrapper_args`` calibrates it)."""
    if config.dp_delta is not None and not 0 < config.dp_delta < 1:
        raise FljaxError(f"dp_delta must be in (0, 1), got {config.dp_delta}")
    accountant(config.accountant, config.participation)
    if config.target_epsilon is not None and not config.target_epsilon > 0:
        raise FljaxError(f"target_epsilon must be > 0 and finite, got {config.target_epsilon!r}")
    if config.target_epsilon is not None and "noise_multiplier" in args:
        raise FljaxError(f"the dp wrapper's noise_multiplier ({args['noise_multiplier']}) and "
                         f"target_epsilon ({config.target_epsilon}) both set the noise; give one")


def probe_arguments(name: str, factory: Callable, args: dict, what: str) -> None:
    """Check a probe's JSON arguments: its factory's, those the experiment supplies, its extras
    and the words that stand for a computed value (PROBE_WORDS)."""
    if not isinstance(args, dict):
        raise FljaxError(f"{what} {name!r} takes a JSON object of arguments, got {args!r}")
    extras = PROBE_EXTRAS.get(name, {})
    for key, kind in extras.items():
        if key in args and (isinstance(args[key], bool) or not isinstance(args[key], kind)):
            raise FljaxError(f"{what} {name!r}: {key} must be an integer, got "
                             f"{json.dumps(args[key])}")
    checked = {k: v for k, v in args.items()
               if k not in extras and PROBE_WORDS.get((name, k)) != v}
    check_kwargs(f"{what} {name!r}", list(inspect.signature(factory).parameters.values()),
                 checked, supplied=PROBE_SUPPLIED.get(name, ()) + tuple(
                     k for k in args if (name, k) in PROBE_WORDS))


def load_config(path: str, **overrides) -> ExperimentConfig:
    """Read a JSON config file (keys are ExperimentConfig fields), then apply ``overrides`` over
    it (``overrides`` naming local_epochs turn the file's local_steps off, and vice versa)."""
    if not os.path.isfile(path):
        raise FljaxError(f"config file {path!r} does not exist")
    try:
        with open(path) as f:
            values = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FljaxError(f"config file {path!r} is not valid JSON: {e}") from None
    if not isinstance(values, dict):
        raise FljaxError(f"config file {path!r} must hold a JSON object, got "
                         f"{type(values).__name__}")
    registry.import_recorded(values.pop("imports", {}))   # a run directory's config.json
    return ExperimentConfig().replace(**values).replace(**overrides)
