"""An independent numpy implementation of one transformer block, for checking the Flax one."""

import numpy as np


def layernorm(x, scale, bias, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def gelu(x):  # tanh approximation, as flax.linen.gelu
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def attention(x, p, causal):
  q = np.einsum("bld,dhk->blhk", x, p["query"])
  k = np.einsum("bld,dhk->blhk", x, p["key"])
  v = np.einsum("bld,dhk->blhk", x, p["value"])
  scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
  if causal:
    length = x.shape[1]
    scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
  scores = scores - scores.max(-1, keepdims=True)
  probs = np.exp(scores)
  probs /= probs.sum(-1, keepdims=True)
  context = np.einsum("bhqs,bshk->bqhk", probs, v)
  return np.einsum("blhk,hkd->bld", context, p["out"])


def mlp(x, p):
  return gelu(x @ p["fc1"]) @ p["fc2"]
