"""The transformer: embeddings, a stack of blocks from the norm-placement factory, an output head.

Notebook API:
  params = init_params(model_cfg, seed)            # nested dict of float32 arrays
  logits = forward(model_cfg, params, tokens)       # float32 [batch, length, vocab]

`model_cfg` is `config.model` (a ConfigDict), a plain dict with the same fields, or a `ModelConfig`.
Parameters carry logical axis names (`nn.with_logical_partitioning`) so that `normstudy.sharding`
can place them on a mesh; `init_params` returns them unboxed.
"""

import dataclasses
import functools
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from normstudy import placements

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hashable copy of `config.model`, so that Flax modules and jit caches can hold it."""
  num_layers: int = 4
  d_model: int = 128
  num_heads: int = 4
  d_ff: int = 512
  vocab_size: int = 256
  max_len: int = 128
  causal: bool = True
  placement: str = "pre_ln"
  norm: str = "layernorm"
  norm_eps: float = 1e-5
  attention_relax: float = 0.0
  dtype: str = "float32"
  scan_layers: bool = True
  dropout: float = 0.0
  tie_embeddings: bool = True
  position_embedding: str = "sinusoidal"
  conv_pos_width: int = 5
  conv_pos_groups: int = 4

  @classmethod
  def create(cls, model_cfg: Any) -> "ModelConfig":
    if isinstance(model_cfg, cls):
      return model_cfg
    fields = {f.name for f in dataclasses.fields(cls)}
    values = dict(model_cfg.items()) if hasattr(model_cfg, "items") else dict(model_cfg)
    unknown = sorted(set(values) - fields)
    if unknown:
      raise ValueError(f"unknown model field(s) {unknown}; known fields: {sorted(fields)}")
    return cls(**values)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]


def xavier_normal(gain: float = 1.0, in_axis=-2, out_axis=-1):
  """Xavier (Glorot) normal with a gain: std = gain * sqrt(2 / (fan_in + fan_out))."""
  return nn.initializers.variance_scaling(
      gain**2, "fan_avg", "normal", in_axis=in_axis, out_axis=out_axis)


POSITION_EMBEDDINGS = ("sinusoidal", "learned", "conv")


def sinusoidal_positions(length: int, dim: int) -> jax.Array:
  """Fixed sin/cos positions (Vaswani et al.): a relative offset is a linear map of them, so an
  encoder can attend to its neighbours from the first steps, which learned positions (init 0.02)
  only reach after many steps."""
  position = jnp.arange(length, dtype=jnp.float32)[:, None]
  freq = jnp.exp(-math.log(10000.0) * jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
  angles = position * freq[None, :]
  table = jnp.zeros((length, dim), jnp.float32)
  table = table.at[:, 0::2].set(jnp.sin(angles))
  return table.at[:, 1::2].set(jnp.cos(angles[:, : dim // 2]))


def _param(module, name, init, shape, axes):
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


class LayerNorm(nn.Module):
  eps: float
  dtype: Any

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    scale = _param(self, "scale", nn.initializers.ones, (d,), ("embed",))
    bias = _param(self, "bias", nn.initializers.zeros, (d,), ("embed",))
    # Statistics in float32: an fp16 variance of a large residual stream overflows.
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return ((x - mean) * jax.lax.rsqrt(var + self.eps) * scale + bias).astype(self.dtype)


class RMSNorm(nn.Module):
  eps: float
  dtype: Any

  @nn.compact
  def __call__(self, x):
    scale = _param(self, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",))
    x = x.astype(jnp.float32)
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return (x * jax.lax.rsqrt(ms + self.eps) * scale).astype(self.dtype)


NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


def make_norm(cfg: ModelConfig, name: str) -> nn.Module:
  if cfg.norm not in NORMS:
    raise ValueError(f"unknown norm {cfg.norm!r}; allowed: {', '.join(sorted(NORMS))}")
  return NORMS[cfg.norm](eps=cfg.norm_eps, dtype=cfg.compute_dtype, name=name)


def relaxed_attention_scores(q, k, alpha: float):
  """Pre-softmax attention logits in float32, from q and k in the compute dtype.

  Plain (alpha = 0): q / sqrt(d_h) then Q K^T, both in the compute dtype, as fp16 training does.
  PB-Relax (alpha > 0): S = (q / (alpha sqrt(d_h))) K^T in the compute dtype, then
  (S - max_row(S)) * alpha in float32. Softmax ignores the per-row shift, so the two agree exactly
  in real arithmetic; the relaxed product stays alpha times further from the fp16 limit (65504).
  Returns (logits [b, h, q, k] float32, row_shift): `row_shift` is max_row(S) * alpha, the part
  removed before the softmax (zero without relax), so logits + row_shift are the unshifted scores.
  """
  dtype = q.dtype
  head_dim = q.shape[-1]
  if alpha > 0:
    q = q / jnp.asarray(alpha * math.sqrt(head_dim), dtype)
  else:
    q = q / jnp.asarray(math.sqrt(head_dim), dtype)
  scores = jnp.einsum("bhqd,bhkd->bhqk", q, k)
  if alpha <= 0:
    return scores.astype(jnp.float32), jnp.zeros(scores.shape[:-1] + (1,), jnp.float32)
  # Softmax is shift invariant, so the row max carries no gradient.
  row_max = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
  shifted = (scores - row_max).astype(jnp.float32) * alpha
  return shifted, row_max.astype(jnp.float32) * alpha


class ConvPositions(nn.Module):
  """wav2vec2/HuBERT/MERT's convolutional relative positions: x + GELU(grouped conv(x)) over the
  sequence. It sees both sides of a position, so it is for encoders only."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    group_width = cfg.d_model // cfg.conv_pos_groups
    kernel = _param(self, "kernel", xavier_normal(1.0, in_axis=1, out_axis=2),
                    (cfg.conv_pos_width, group_width, cfg.d_model), (None, None, "embed"))
    y = jax.lax.conv_general_dilated(
        x.astype(cfg.compute_dtype), kernel.astype(cfg.compute_dtype), window_strides=(1,),
        padding="SAME", dimension_numbers=("NWC", "WIO", "NWC"),
        feature_group_count=cfg.conv_pos_groups)
    return nn.gelu(y)


class Attention(nn.Module):
  cfg: ModelConfig
  branch_gain: float
  telemetry: bool = False

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dtype = cfg.compute_dtype
    qkv_shape = (cfg.d_model, cfg.num_heads, cfg.head_dim)
    qkv_axes = ("embed", "heads", "kv")
    qk_init = xavier_normal(1.0, in_axis=0, out_axis=(1, 2))
    v_init = xavier_normal(self.branch_gain, in_axis=0, out_axis=(1, 2))
    wq = _param(self, "query", qk_init, qkv_shape, qkv_axes)
    wk = _param(self, "key", qk_init, qkv_shape, qkv_axes)
    wv = _param(self, "value", v_init, qkv_shape, qkv_axes)
    wo = _param(self, "out", xavier_normal(self.branch_gain, in_axis=(0, 1), out_axis=2),
                (cfg.num_heads, cfg.head_dim, cfg.d_model), ("heads", "kv", "embed"))
    # Heads-major [batch, heads, length, head_dim]: the score and context products then need
    # no transposes (measurably faster on CPU than [batch, length, heads, head_dim]).
    q = jnp.einsum("bld,dhk->bhlk", x, wq.astype(dtype))
    k = jnp.einsum("bld,dhk->bhlk", x, wk.astype(dtype))
    v = jnp.einsum("bld,dhk->bhlk", x, wv.astype(dtype))

    logits, row_shift = relaxed_attention_scores(q, k, cfg.attention_relax)
    length = x.shape[1]
    if cfg.causal:
      allowed = jnp.tril(jnp.ones((length, length), bool))
      logits = jnp.where(allowed, logits, -jnp.inf)
    if self.telemetry:
      seen = logits + row_shift
      if cfg.causal:
        seen = jnp.where(allowed, seen, -jnp.inf)
      self.sow("intermediates", "attn_logit_max", jnp.max(seen))
    probs = jax.nn.softmax(logits, axis=-1).astype(dtype)
    context = jnp.einsum("bhqk,bhkd->bhqd", probs, v)
    return jnp.einsum("bhlk,hkd->bld", context, wo.astype(dtype))


class Mlp(nn.Module):
  cfg: ModelConfig
  branch_gain: float

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dtype = cfg.compute_dtype
    init = xavier_normal(self.branch_gain)
    w1 = _param(self, "fc1", init, (cfg.d_model, cfg.d_ff), ("embed", "mlp"))
    w2 = _param(self, "fc2", init, (cfg.d_ff, cfg.d_model), ("mlp", "embed"))
    h = nn.gelu(jnp.einsum("bld,df->blf", x, w1.astype(dtype)))
    return jnp.einsum("blf,fd->bld", h, w2.astype(dtype))


class Block(nn.Module):
  """One transformer layer; the placement decides where the norms and residuals go."""
  cfg: ModelConfig
  deterministic: bool = True
  telemetry: bool = False

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    placement = placements.get(cfg.placement)
    alpha = placement.residual_alpha(cfg.num_layers, cfg.causal)
    gain = placement.branch_gain(cfg.num_layers, cfg.causal)

    def norms_of(prefix):
      return lambda slot: make_norm(cfg, f"{prefix}_norm" if slot == "in" else f"{prefix}_out_norm")

    def dropped(f):
      return lambda h: nn.Dropout(cfg.dropout)(f(h), deterministic=self.deterministic)

    attention = Attention(cfg, gain, self.telemetry, name="attention")
    mlp = Mlp(cfg, gain, name="mlp")
    x = placement.wrap(x, dropped(attention), norms_of("attention"), alpha)
    x = placement.wrap(x, dropped(mlp), norms_of("mlp"), alpha)
    if self.telemetry:
      self.sow("intermediates", "act_rms",
               jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32)))))
    return x


class _ScanBlock(Block):
  """Block with the (carry, xs) -> (carry, ys) signature nn.scan needs."""

  def __call__(self, x, _):
    return super().__call__(x), None


class Transformer(nn.Module):
  cfg: ModelConfig
  deterministic: bool = True
  telemetry: bool = False

  @nn.compact
  def __call__(self, tokens, mask=None):
    """tokens: int32 [batch, length]; mask: optional bool [batch, length] of positions whose input
    is replaced by the learned mask embedding (encoders trained by masked prediction)."""
    cfg = self.cfg
    dtype = cfg.compute_dtype
    embedding = _param(self, "embedding", nn.initializers.normal(0.02),
                       (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))
    x = jnp.take(embedding, tokens, axis=0)
    if cfg.position_embedding == "learned":
      x = x + _param(self, "pos_embedding", nn.initializers.normal(0.02),
                     (cfg.max_len, cfg.d_model), (None, "embed"))[: tokens.shape[1]]
    elif cfg.position_embedding == "sinusoidal":
      x = x + sinusoidal_positions(cfg.max_len, cfg.d_model)[: tokens.shape[1]]
    if not cfg.causal:
      mask_embedding = _param(self, "mask_embedding", nn.initializers.normal(0.02),
                              (cfg.d_model,), ("embed",))
      if mask is not None:
        x = jnp.where(mask[..., None], mask_embedding, x)
    if cfg.position_embedding == "conv":
      x = x + ConvPositions(cfg, name="pos_conv")(x)
    x = nn.Dropout(cfg.dropout)(x.astype(dtype), deterministic=self.deterministic)

    if cfg.scan_layers:
      stack = nn.scan(
          _ScanBlock,
          variable_axes={"params": 0, "intermediates": 0},
          split_rngs={"params": True, "dropout": True},
          length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"},
      )(cfg, self.deterministic, self.telemetry, name="layers")
      x, _ = stack(x, None)
    else:
      for i in range(cfg.num_layers):
        x = Block(cfg, self.deterministic, self.telemetry, name=f"layer_{i}")(x)

    if placements.get(cfg.placement).final_norm:
      x = make_norm(cfg, "final_norm")(x)
    if cfg.tie_embeddings:
      head = embedding.T
    else:
      head = _param(self, "head", xavier_normal(1.0), (cfg.d_model, cfg.vocab_size),
                    ("embed", "vocab"))
    logits = jnp.einsum("bld,dv->blv", x, head.astype(dtype))
    return logits.astype(jnp.float32)


def init_params(model_cfg: Any, seed: int = 0) -> dict:
  """Initial parameters as a nested dict of float32 arrays (logical-axis boxes removed)."""
  cfg = ModelConfig.create(model_cfg)
  return nn.unbox(boxed_init(cfg)(jax.random.PRNGKey(seed)))


def boxed_init(cfg: ModelConfig):
  """A function key -> boxed params (with logical axis names), for sharded initialisation."""
  def init(key):
    tokens = jnp.zeros((1, cfg.max_len), jnp.int32)
    mask = None if cfg.causal else jnp.zeros((1, cfg.max_len), bool)
    return Transformer(cfg).init(key, tokens, mask)["params"]
  return init


@functools.lru_cache(maxsize=32)
def _jitted_forward(cfg: ModelConfig):
  return jax.jit(lambda params, tokens, mask: Transformer(cfg).apply(
      {"params": params}, tokens, mask))


def forward(model_cfg: Any, params: Mapping, tokens, mask=None) -> jax.Array:
  """float32 logits [batch, length, vocab] for int32 tokens [batch, length] (no dropout)."""
  cfg = ModelConfig.create(model_cfg)
  tokens = jnp.asarray(tokens, jnp.int32)
  if mask is not None:
    mask = jnp.asarray(mask, bool)
  return _jitted_forward(cfg)(params, tokens, mask)
