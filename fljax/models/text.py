"""Token models: LEAF/FedGA's character LSTM (Shakespeare) and a BERT-shaped transformer classifier
(FedDecay's SST2 model, BERT-Tiny), loadable from a local pretrained checkpoint.
"""

from __future__ import annotations

import os
import zipfile

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from fljax.errors import FljaxError
from fljax.models.layers import dropout


class CharLSTM(nn.Module):
    """Embedding (8) -> ``layers`` stacked LSTMs (``hidden`` units) -> dense over the alphabet, at
    every position: x int32 [B, T] -> logits [B, T, vocab] (next character after each prefix).
    LEAF's Shakespeare model: embedding 8, 2 x LSTM 256, 80 characters; FedGA's (Dandi, Barba and
    Jaggi, AAAI 2022, B.5): 2 x LSTM 100. Features: the last LSTM layer's outputs [B, T, hidden]."""

    vocab: int = 80
    hidden: int = 100
    layers: int = 2
    embed: int = 8

    @nn.compact
    def __call__(self, x, train: bool = False, with_features: bool = False):
        h = nn.Embed(self.vocab, self.embed, name="embed")(x)
        for i in range(self.layers):
            h = nn.RNN(nn.OptimizedLSTMCell(self.hidden, name=f"lstm{i + 1}"))(h)
        logits = nn.Dense(self.vocab, name="out")(h)
        return (h, logits) if with_features else logits


def gelu(x):
    """BERT's exact GELU: x Phi(x) = x (1 + erf(x / sqrt 2)) / 2."""
    return jax.nn.gelu(x, approximate=False)


class EncoderLayer(nn.Module):
    """BERT's post-LayerNorm encoder layer: h = LN(x + Drop(Attn(x))), LN(h + Drop(FFN(h)))."""

    hidden: int
    heads: int
    intermediate: int
    dropout: float

    @nn.compact
    def __call__(self, x, keep, train: bool):
        b, t, d = x.shape
        split = lambda a: a.reshape(b, t, self.heads, d // self.heads)
        q, k, v = (split(nn.Dense(d, name=n)(x)) for n in ("query", "key", "value"))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // self.heads)
        scores = jnp.where(keep[:, None, None, :], scores, jnp.finfo(scores.dtype).min)
        attention = dropout(self, train)(jax.nn.softmax(scores))
        context = jnp.einsum("bhqk,bkhd->bqhd", attention, v).reshape(b, t, d)
        drop = dropout(self, train)
        x = nn.LayerNorm(1e-12, name="attention_norm")(x + drop(nn.Dense(d, name="output")(context)))
        ffn = nn.Dense(d, name="ffn_out")(gelu(nn.Dense(self.intermediate, name="ffn_in")(x)))
        return nn.LayerNorm(1e-12, name="ffn_norm")(x + drop(ffn))


class TransformerClassifier(nn.Module):
    """A BERT encoder and classifier (defaults: BERT-Tiny, 2 layers, hidden 128, 2 heads, 512
    intermediate): word + position + type-0 embeddings -> LayerNorm -> dropout -> layers ->
    pooler tanh(W h_[CLS]) -> dropout -> classifier. x int32 [B, T] with pad id 0 (masked out of
    attention); logits [B, num_classes]; features: the pooled output."""

    num_classes: int = 2
    vocab: int = 30522
    hidden: int = 128
    layers: int = 2
    heads: int = 2
    intermediate: int = 512
    max_positions: int = 512
    dropout: float = 0.1

    @nn.compact
    def __call__(self, x, train: bool = False, with_features: bool = False):
        positions = jnp.arange(x.shape[1])
        h = (nn.Embed(self.vocab, self.hidden, name="word_embeddings")(x)
             + nn.Embed(self.max_positions, self.hidden, name="position_embeddings")(positions)
             + nn.Embed(2, self.hidden, name="token_type_embeddings")(jnp.zeros_like(x)))
        h = dropout(self, train)(
            nn.LayerNorm(1e-12, name="embedding_norm")(h))
        for i in range(self.layers):
            h = EncoderLayer(self.hidden, self.heads, self.intermediate, self.dropout,
                             name=f"layer{i}")(h, x != 0, train)
        pooled = jnp.tanh(nn.Dense(self.hidden, name="pooler")(h[:, 0]))
        logits = nn.Dense(self.num_classes, name="classifier")(
            dropout(self, train)(pooled))
        return (pooled, logits) if with_features else logits


def huggingface_names(layers: int) -> dict[tuple, str]:
    """fljax param path -> HuggingFace BERT name (torch Linear weights are [out, in])."""
    names = {("word_embeddings", "embedding"): "bert.embeddings.word_embeddings.weight",
             ("position_embeddings", "embedding"): "bert.embeddings.position_embeddings.weight",
             ("token_type_embeddings", "embedding"): "bert.embeddings.token_type_embeddings.weight",
             ("embedding_norm", "scale"): "bert.embeddings.LayerNorm.weight",
             ("embedding_norm", "bias"): "bert.embeddings.LayerNorm.bias",
             ("pooler", "kernel"): "bert.pooler.dense.weight",
             ("pooler", "bias"): "bert.pooler.dense.bias"}
    parts = {"query": "attention.self.query", "key": "attention.self.key",
             "value": "attention.self.value", "output": "attention.output.dense",
             "attention_norm": "attention.output.LayerNorm", "ffn_in": "intermediate.dense",
             "ffn_out": "output.dense", "ffn_norm": "output.LayerNorm"}
    for i in range(layers):
        for ours, theirs in parts.items():
            norm = ours.endswith("norm")
            names[(f"layer{i}", ours, "scale" if norm else "kernel")] = \
                f"bert.encoder.layer.{i}.{theirs}.weight"
            names[(f"layer{i}", ours, "bias")] = f"bert.encoder.layer.{i}.{theirs}.bias"
    return names


def load_bert_checkpoint(path: str, params, layers: int = 2):
    """``params`` of a TransformerClassifier with the encoder and pooler from a local BERT
    checkpoint: an ``.npz`` of HuggingFace names (the classifier keeps its initialisation).
    Make one on a machine with internet::

        from transformers import BertModel     # pip install torch transformers
        model = BertModel.from_pretrained("prajjwal1/bert-tiny")
        numpy.savez("bert_tiny.npz", **{"bert." + k: v.numpy()
                                        for k, v in model.state_dict().items()})
    """
    if not os.path.isfile(path):
        raise FljaxError(f"pretrained checkpoint {path!r} does not exist (fljax never downloads)")
    try:
        with np.load(path, allow_pickle=False) as f:
            weights = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        raise FljaxError(f"pretrained checkpoint {path!r} is not a readable .npz file of "
                         f"HuggingFace BERT weights") from None
    flat = dict(flatten_dict(params))
    for ours, theirs in huggingface_names(layers).items():
        if theirs not in weights:
            raise FljaxError(f"pretrained checkpoint {path!r} lacks {theirs!r}")
        kernel = ours[-1] == "kernel"
        value = weights[theirs].T if kernel else weights[theirs]
        if value.shape != flat[ours].shape:
            torch_shape = lambda shape: tuple(shape[::-1]) if kernel else tuple(shape)
            raise FljaxError(f"pretrained {theirs!r} in {path!r} has shape "
                             f"{torch_shape(value.shape)}; the model needs "
                             f"{torch_shape(flat[ours].shape)}")
        flat[ours] = jnp.asarray(value, flat[ours].dtype)
    return unflatten_dict(flat)
