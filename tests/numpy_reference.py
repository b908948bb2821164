"""An independent numpy transcription of the published formulas, for checking the Flax model.

One reference block per registered placement (`BLOCKS`), written from the papers' equations:
adding a placement means adding its entry here (tests/test_model.py checks the table covers the
registry).
"""

import math

import numpy as np


def layernorm(x, scale, bias, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def rmsnorm(x, scale, eps):
  return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale


def gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def gelu_exact(x):  # x * Phi(x), Phi the standard normal CDF
  erf = np.vectorize(math.erf)
  return 0.5 * x * (1 + erf(np.asarray(x, np.float64) / math.sqrt(2)))


ACTIVATIONS = {"gelu": gelu_exact, "gelu_tanh": gelu_tanh, "relu": lambda x: np.maximum(x, 0)}


def _bias(p, name, shape_like):
  return p[name] if name in p else np.zeros(shape_like)


def attention(x, p, causal, qk_norm=None, softcap=0.0, eps=1e-5, qkv_norm=False):
  """Multi-head attention; `qk_norm` ("layernorm" | "rmsnorm") normalises q and k per head over
  head_dim (ViT-22B); `qkv_norm` normalises q, k and v per head over head_dim with the block's
  norm, gain and bias (a placement's QKV norm: HybridNorm, Zhuo et al. 2025, eq. 5); `softcap` caps the scores, cap * tanh(s / cap) (Gemma 2); an "inner_norm"
  in `p` normalises the heads' concatenation before the output projection (Sub-LN)."""
  q = np.einsum("bld,dhk->blhk", x, p["query"]) + _bias(p, "query_bias", 1)
  k = np.einsum("bld,dhk->blhk", x, p["key"]) + _bias(p, "key_bias", 1)
  v = np.einsum("bld,dhk->blhk", x, p["value"]) + _bias(p, "value_bias", 1)
  if qk_norm == "layernorm":
    # No bias: ViT-22B normalises q and k with a gain only.
    q = layernorm(q, p["query_norm"]["scale"], 0.0, eps)
    k = layernorm(k, p["key_norm"]["scale"], 0.0, eps)
  elif qk_norm == "rmsnorm":
    q = rmsnorm(q, p["query_norm"]["scale"], eps)
    k = rmsnorm(k, p["key_norm"]["scale"], eps)
  if qkv_norm:
    q, k, v = (_norm(p, f"{name}_qkv_norm", y, eps)
               for name, y in (("query", q), ("key", k), ("value", v)))
  scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
  if softcap:
    scores = softcap * np.tanh(scores / softcap)
  if causal:
    length = x.shape[1]
    scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
  scores = scores - scores.max(-1, keepdims=True)
  probs = np.exp(scores)
  probs /= probs.sum(-1, keepdims=True)
  context = np.einsum("bhqs,bshk->bqhk", probs, v)
  if "inner_norm" in p:
    b, l, h, k = context.shape
    joined = _norm(p, "inner_norm", context.reshape(b, l, h * k), eps)
    return joined @ p["out"].reshape(h * k, -1) + _bias(p, "out_bias", 1)
  return np.einsum("blhk,hkd->bld", context, p["out"]) + _bias(p, "out_bias", 1)


def mlp(x, p, activation="gelu_tanh", eps=1e-5):
  h = ACTIVATIONS[activation](x @ p["fc1"] + _bias(p, "fc1_bias", 1))
  if "inner_norm" in p:  # Sub-LN: a norm before fc2
    h = _norm(p, "inner_norm", h, eps)
  return h @ p["fc2"] + _bias(p, "fc2_bias", 1)


def dyt(x, alpha, scale, bias):
  """Dynamic Tanh (Zhu et al. 2025, eq. 1): gamma * tanh(alpha x) + beta."""
  return np.tanh(alpha * x) * scale + bias


def _norm(params, key, x, eps):
  if "alpha" in params[key]:  # model.norm=dyt
    return dyt(x, params[key]["alpha"], params[key]["scale"], params[key]["bias"])
  return layernorm(x, params[key]["scale"], params[key]["bias"], eps)


def pre_ln(x, params, n, causal, eps, activation):
  del n
  h = x + attention(_norm(params, "attention_norm", x, eps), params["attention"], causal)
  return h + mlp(_norm(params, "mlp_norm", h, eps), params["mlp"], activation)


def _post(alpha):
  def block(x, params, n, causal, eps, activation):
    a = alpha(n)
    h = _norm(params, "attention_norm", a * x + attention(x, params["attention"], causal), eps)
    return _norm(params, "mlp_norm", a * h + mlp(h, params["mlp"], activation), eps)
  return block


def sandwich_ln(x, params, n, causal, eps, activation):
  del n
  h = x + _norm(params, "attention_out_norm", attention(
      _norm(params, "attention_norm", x, eps), params["attention"], causal, eps=eps), eps)
  return h + _norm(params, "mlp_out_norm", mlp(
      _norm(params, "mlp_norm", h, eps), params["mlp"], activation, eps), eps)


def reordered_ln(x, params, n, causal, eps, activation):
  """OLMo 2's reordered norm (Team OLMo 2024): x + LN(F(x)), the norm after the sublayer."""
  del n
  h = x + _norm(params, "attention_norm", attention(x, params["attention"], causal, eps=eps), eps)
  return h + _norm(params, "mlp_norm", mlp(h, params["mlp"], activation, eps), eps)


def sub_ln(x, params, n, causal, eps, activation):
  """Magneto (Wang et al. 2022): x + F(LN(x)) with F's own LN before its output projection;
  the inner norms are in params["attention"]["inner_norm"] and params["mlp"]["inner_norm"]."""
  del n
  h = x + attention(_norm(params, "attention_norm", x, eps), params["attention"], causal,
                    eps=eps)
  return h + mlp(_norm(params, "mlp_norm", h, eps), params["mlp"], activation, eps)


def normformer(x, params, n, causal, eps, activation):
  """NormFormer (Shleifer et al. 2021, figure 1, HeadScale left out): a LN after attention,
  before the residual sum, and one after the MLP's activation (params["mlp"]["inner_norm"])."""
  del n
  assert "inner_norm" in params["mlp"] and "inner_norm" not in params["attention"]
  assert "mlp_out_norm" not in params
  h = x + _norm(params, "attention_out_norm", attention(
      _norm(params, "attention_norm", x, eps), params["attention"], causal, eps=eps), eps)
  return h + mlp(_norm(params, "mlp_norm", h, eps), params["mlp"], activation, eps)


def hybrid_norm(x, params, n, causal, eps, activation):
  """HybridNorm (Zhuo et al. 2025, eqs. 5-7): Y = X + MHA with Norm(Q), Norm(K), Norm(V);
  X' = FFN(Norm(Y)) + Norm(Y)."""
  del n
  h = x + attention(x, params["attention"], causal, eps=eps, qkv_norm=True)
  y = _norm(params, "mlp_norm", h, eps)
  return y + mlp(y, params["mlp"], activation, eps)


def mix_ln(x, params, n, causal, eps, activation, index=0, fraction=0.25):
  """Mix-LN (Li et al. 2024): the first ceil(fraction * n) layers Post-LN, the rest Pre-LN."""
  if index < math.ceil(fraction * n):
    return _post(lambda n: 1.0)(x, params, n, causal, eps, activation)
  return pre_ln(x, params, n, causal, eps, activation)


def rezero(x, params, n, causal, eps, activation):
  """ReZero (Bachlechner et al. 2020): x + a F(x), one learned scalar a per sublayer."""
  del n, eps
  # One residual weight per layer, for both sublayers (Bachlechner et al. 2020; rztx.py).
  h = x + params["rezero"] * attention(x, params["attention"], causal)
  return h + params["rezero"] * mlp(h, params["mlp"], activation)



def unit(x, axis=-1):
  """nGPT's Norm: x / ||x||_2."""
  return x / np.sqrt((x**2).sum(axis, keepdims=True))


def ngpt(x, params, n, causal, eps, activation):
  """nGPT (Loshchilov et al. 2024, eqs. 10-11): h <- Norm(h + alpha_A (Norm(h_A) - h)), h_A the
  attention's output on h, then the same with the MLP; alpha = stored * alpha_init / alpha_scale
  with alpha_init = 0.05 and alpha_scale = 1/sqrt(d) (section 2.3, Table 1)."""
  del n, eps
  d = x.shape[-1]
  a_att = params["attention_ngpt_alpha"] * 0.05 * np.sqrt(d)
  h = unit(x + a_att * (unit(attention(x, params["attention"], causal)) - x))
  a_mlp = params["mlp_ngpt_alpha"] * 0.05 * np.sqrt(d)
  return unit(h + a_mlp * (unit(mlp(h, params["mlp"], activation)) - h))


# nGPT's renormalisation after each update (section 2.6): every matrix along its embedding
# (d_model) axis, written out per parameter: the axis each one's d_model is.
NGPT_EMBED_AXES = {"embedding": 1, "head": 0, "query": 0, "key": 0, "value": 0, "out": -1,
                   "fc1": 0, "fc2": -1, "kernel": -1}


# placement -> (block(x, params, num_layers, causal, eps, activation), has a final norm)
BLOCKS = {
    "pre_ln": (pre_ln, True),
    "post_ln": (_post(lambda n: 1.0), False),
    "deepnorm": (_post(lambda n: (2 * n) ** 0.25), False),  # DeepNet: alpha = (2N)^(1/4)
    "sandwich_ln": (sandwich_ln, True),
    "sub_ln": (sub_ln, True),
    "peri_ln": (sandwich_ln, True),  # Peri-LN's block is Sandwich-LN's; it adds embedding norm
    "mix_ln": (mix_ln, True),
    "reordered_ln": (reordered_ln, True),
    "normformer": (normformer, True),
    "hybrid_norm": (hybrid_norm, True),
    "rezero": (rezero, False),
    "ngpt": (ngpt, False),
}
