"""The transformer's layers: parameters with their logical axes and decay roles, norms,
activations, attention (with its relax forms and soft-cap), the MLP, the position convolution and
a block, whose norms and residuals its placement wires (normstudy.core.placements).

Dtypes (docs/reference.md, "Precision and fidelity"): parameters, embeddings and positions are
float32; the residual stream, the projections, attention products and the position conv run in the
compute dtype; norm statistics, GELU, the softmax, the relaxed score shift and the loss run in
float32, as fairseq runs them under --fp16. `cfg` is a normstudy.core.model.ModelConfig.
"""

import functools
import math
from typing import Any

from flax import struct
import flax.linen as nn
from flax.linen import spmd
import jax
import jax.numpy as jnp

from normstudy.core import parametrizations
from normstudy.core import placements
from normstudy.core import telemetry
from normstudy.core.registry import Registry


class RoleBox(spmd.LogicallyPartitioned):
  """A parameter's logical axis names plus its weight-decay role and its parametrization role
  (normstudy.core.parametrizations.ROLES, with its fan-in), declared where it is created."""
  decay: bool = struct.field(default=True, pytree_node=False)
  role: str = struct.field(default="vector", pytree_node=False)
  fan_in: int = struct.field(default=1, pytree_node=False)


def param(layer, name, init, shape, axes, decay=True, role="vector", fan_in=1,
          fan_scaled=False):
  """A float32 parameter of the flax module `layer`, as it is used: under a parametrization
  (layer.cfg.parametrization) its initialiser is that parametrization's for `role` and the value
  returned is the stored one times its forward multiplier (so its gradient carries the factor
  too, as muP's multipliers do). `fan_scaled`: `init` already scales with the fans whatever
  model.init says (parametrizations.init_multiplier)."""
  cfg = getattr(layer, "cfg", None)
  if cfg is not None and role != "vector":
    if parametrizations.unit_init(cfg, role):
      init = nn.initializers.normal(1.0)
    elif (factor := parametrizations.init_multiplier(cfg, role, fan_scaled)) != 1.0:
      init = _times(init, factor)

  def boxed(*args):
    return RoleBox(init(*args), names=axes, decay=decay, role=role, fan_in=fan_in)
  value = layer.param(name, boxed, shape, jnp.float32)
  multiplier = 1.0 if cfg is None else parametrizations.forward_multiplier(cfg, role, fan_in)
  return value if multiplier == 1.0 else value * multiplier


def _times(init, factor):
  return lambda *args: init(*args) * factor


def _plus_bias(module, name, y, axes, dims=None):
  """y + a zero-initialised, undecayed bias over y's dimensions `dims` (default: the trailing
  `len(axes)`), when `cfg.use_bias` (fairseq, MERT and torchscale give every projection one)."""
  if not module.cfg.use_bias:
    return y
  dims = tuple(range(y.ndim - len(axes), y.ndim)) if dims is None else dims
  bias = param(module, name, nn.initializers.zeros, tuple(y.shape[d] for d in dims), axes,
               decay=False)
  return add_bias(y, bias, dims)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def add_bias(y, bias, dims):
  """y + bias (cast to y's dtype) broadcast over y's dimensions other than `dims`.

  Its gradient for the bias is the sum of y's gradient accumulated in float32 and then rounded
  to y's dtype, as PyTorch sums a half tensor's gradient (fairseq's --fp16 bias gradients): a sum
  beyond float16's range is still inf, so loss-scale overflow is what it was. Differentiated
  plainly, JAX sums the float16 gradient in float16, which XLA:CPU computes as a slow tree of
  reduce-windows (`benchmarks/throughput.py profile`: 12% of the seed recipe's step) and rounds
  at every level."""
  return y + jnp.expand_dims(bias.astype(y.dtype), _other_dims(y.ndim, dims))


def _other_dims(ndim, dims):
  return tuple(d for d in range(ndim) if d not in dims)


def _add_bias_fwd(y, bias, dims):
  return add_bias(y, bias, dims), jnp.zeros((), bias.dtype)


def _add_bias_bwd(dims, bias_zero, g):
  # The sum as a product with ones (exact in any dtype), accumulated in float32: XLA:CPU runs a
  # dot 1.5x faster than the reduction it would otherwise emit.
  others = _other_dims(g.ndim, dims)
  ones = jnp.ones(tuple(g.shape[d] for d in others), g.dtype)
  summed = jax.lax.dot_general(ones, g, ((tuple(range(len(others))), others), ((), ())),
                               preferred_element_type=jnp.float32)
  return g, summed.astype(g.dtype).astype(bias_zero.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


def xavier_normal(gain: float = 1.0, in_axis=-2, out_axis=-1):
  """Xavier (Glorot) normal with a gain: std = gain * sqrt(2 / (fan_in + fan_out))."""
  return nn.initializers.variance_scaling(
      gain**2, "fan_avg", "normal", in_axis=in_axis, out_axis=out_axis)


BERT_STD = 0.02


def projection_init(cfg, gain: float = 1.0, in_axis=-2, out_axis=-1):
  """Init of a projection. `xavier`: Xavier-normal with `gain` (DeepNet's formulation); `bert`:
  normal(0.02 * gain), fairseq's init_bert_params, with the placement's gain on top."""
  if cfg.init == "bert":
    return nn.initializers.normal(BERT_STD * gain)
  return xavier_normal(gain, in_axis, out_axis)


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


class LayerNorm(nn.Module):
  eps: float
  dtype: Any
  axis_name: str = "embed"  # the logical axis of the normalised dimension
  use_bias: bool = True  # False: a gain only (QK-norm: flax's normalize_qk, ViT-22B)

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    axes = (self.axis_name,)
    scale = param(self, "scale", nn.initializers.ones, (d,), axes, decay=False)
    bias = (param(self, "bias", nn.initializers.zeros, (d,), axes, decay=False)
            if self.use_bias else 0.0)
    # Statistics in float32: an fp16 variance of a large residual stream overflows.
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return ((x - mean) * jax.lax.rsqrt(var + self.eps) * scale + bias).astype(self.dtype)


class RMSNorm(nn.Module):
  eps: float
  dtype: Any
  axis_name: str = "embed"
  use_bias: bool = False  # RMSNorm has none; the field keeps make_norm's call uniform

  @nn.compact
  def __call__(self, x):
    scale = param(self, "scale", nn.initializers.ones, (x.shape[-1],), (self.axis_name,),
                  decay=False)
    x = x.astype(jnp.float32)
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return (x * jax.lax.rsqrt(ms + self.eps) * scale).astype(self.dtype)


class DyT(nn.Module):
  """Dynamic Tanh in place of a norm (Zhu et al. 2025, "Transformers without Normalization",
  eq. 1): gamma * tanh(alpha x) + beta, alpha one learned scalar per norm initialised to
  `alpha` (model.dyt_alpha; the paper's 0.5), gamma and beta per channel, initialised to ones
  and zeros. No statistics: tanh in float32, as the norms compute theirs."""
  eps: float  # unused: make_norm's call is uniform
  dtype: Any
  axis_name: str = "embed"
  use_bias: bool = True
  alpha: float = 0.5

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    axes = (self.axis_name,)
    alpha = param(self, "alpha", nn.initializers.constant(self.alpha), (), (), decay=False)
    scale = param(self, "scale", nn.initializers.ones, (d,), axes, decay=False)
    bias = (param(self, "bias", nn.initializers.zeros, (d,), axes, decay=False)
            if self.use_bias else 0.0)
    return (jnp.tanh(alpha * x.astype(jnp.float32)) * scale + bias).astype(self.dtype)


NORMS: Registry[type] = Registry("model.norm")
NORMS.register("layernorm", LayerNorm)
NORMS.register("rmsnorm", RMSNorm)
NORMS.register("dyt", DyT)


def make_norm(cfg, name: str, kind: str | None = None, axis_name: str = "embed",
              use_bias: bool = True) -> nn.Module:
  """The config's norm (or `kind`) over the last axis, statistics in float32; `use_bias` False
  drops LayerNorm's bias."""
  norm = NORMS.get(kind or cfg.norm)
  extra = {"alpha": cfg.dyt_alpha} if norm is DyT else {}
  return norm(eps=cfg.norm_eps, dtype=cfg.compute_dtype, axis_name=axis_name, name=name,
              use_bias=use_bias and norm is not RMSNorm, **extra)


def constrain(x, axes):
  """`x` constrained to the layout of its logical `axes` (normstudy.engine.sharding.RULES: the
  batch over data x fsdp, heads over tensor). Without it XLA's propagation follows the fsdp-sharded
  weights and computes attention on the whole batch on every chip (4.9x the temporaries at
  fsdp=4, measured with normstudy.compile). A no-op outside a rules context (one device)."""
  return nn.with_logical_constraint(x, axes)


def boundary(cfg, x):
  """`fusion_boundary(x)` where the program's compiler wants it (`cfg.fusion_boundaries`, set
  by normstudy.engine.platform for XLA:CPU, where it was measured); the identity elsewhere (GPU
  compilers fuse a dot's epilogue across it otherwise, and keep their own layouts)."""
  return fusion_boundary(x) if cfg.fusion_boundaries else x


def widening_product(cfg, x, w):
  """x [..., d] @ w [d, f] for f larger than d (the MLP's first projection).

  On XLA:CPU (`cfg.fusion_boundaries`) its gradient for w is written as x^T g, which XLA:CPU
  computes by transposing x, the smaller operand; differentiated plainly it transposes g, f/d
  times larger (a copy per layer of 0.6 ms at benchmarks/throughput.py's S and 4.3 ms at M). The
  same products, the same bits (benchmarks/trees.py bits)."""
  return _widening_product(x, w) if cfg.fusion_boundaries else jnp.einsum("...d,df->...f", x, w)


@jax.custom_vjp
def _widening_product(x, w):
  return jnp.einsum("...d,df->...f", x, w)


def _widening_product_forward(x, w):
  return _widening_product(x, w), (x, w)


def _widening_product_backward(residuals, g):
  x, w = residuals
  return jnp.einsum("...f,df->...d", g, w), jnp.einsum("...d,...f->df", x, g)


_widening_product.defvjp(_widening_product_forward, _widening_product_backward)


@jax.custom_vjp
def fusion_boundary(x):
  """The identity, forward and backward, that XLA may not fuse across (`optimization_barrier`).

  Placed on each projection's output, the embedding plus positions, the logits and each block's
  output. Without it XLA:CPU
  fuses elementwise work into the layout copies before the weight-gradient dots and computes
  it there in transposed order, several inputs read with a stride; between the layers of an
  unrolled stack it fuses the residual stream's gradient, a sum over every later layer's
  branch, into each consumer and recomputes it there (`benchmarks/throughput.py profile` measures
  what such copies cost; docs/throughput.md). XLA:CPU drops barriers before fusion unless its
  `cse_barrier_expander` pass is off (platform.CPU_COMPILER_OPTIONS). Values are unchanged up to
  the rounding of a different fusion."""
  return jax.lax.optimization_barrier(x)


def _boundary_forward(x):
  return jax.lax.optimization_barrier(x), None


def _boundary_backward(_, cotangent):
  return (jax.lax.optimization_barrier(cotangent),)


fusion_boundary.defvjp(_boundary_forward, _boundary_backward)


def softcap(x, cap: float):
  """Gemma 2's soft-capping, cap * tanh(x / cap) (Gemma Team 2024, "Gemma 2", section 2): smooth,
  close to x for |x| << cap, bounded by cap. `cap` 0 leaves x as it is."""
  return cap * jnp.tanh(x / cap) if cap > 0 else x


def _float32_gelu(approximate: bool):
  def gelu(x):
    # fairseq: gelu(x.float()).type_as(x). In float16 the tanh form's 3x^2 overflows from
    # |x| ~ 148, and its gradient turns NaN.
    return jax.nn.gelu(x.astype(jnp.float32), approximate=approximate).astype(x.dtype)
  return gelu


ACTIVATIONS: Registry[Any] = Registry("model.activation")
ACTIVATIONS.register("gelu", _float32_gelu(approximate=False))
ACTIVATIONS.register("gelu_tanh", _float32_gelu(approximate=True))
ACTIVATIONS.register("relu", jax.nn.relu)


def attention_scores(q, k, alpha: float = 0.0, form: str = "pb_relax", scores_dtype=None,
                     scale: float | None = None):
  """Pre-softmax attention logits in float32, from q and k [b, h, l, d] in the compute dtype.

  `scores_dtype` (model.attention_scores_dtype="float32"): q and k are cast to it first, so the
  product cannot overflow float16's 65504 (the simplest fix for score overflow; it costs the
  product's half-precision speed).
  Plain (alpha = 0): (q / sqrt(d)) K^T in the compute dtype, as fp16 training does.
  `pb_relax` (CogView's PB-Relax, Ding et al. 2021): S = (q / (alpha sqrt(d))) K^T in the
    compute dtype, then (S - max_row(S)) * alpha in float32: the product stays alpha times
    further from fp16's 65504.
  `after_product` (MERT's released fairseq code): W = (q / sqrt(d)) K^T in the compute dtype,
    then (W/alpha - max_row(W/alpha)) * alpha; no protection once the product overflows.
  Softmax ignores a per-row shift, so all three agree in real arithmetic. `scale`: what q.k is
  multiplied by in place of 1/sqrt(d) (a parametrization's, normstudy.core.parametrizations).
  Returns (logits,
  row_shift): logits + row_shift are the unshifted scores (row_shift is zero without relax).
  """
  if scores_dtype is not None:
    q, k = q.astype(scores_dtype), k.astype(scores_dtype)
  dtype = q.dtype
  head_dim = q.shape[-1]
  root = math.sqrt(head_dim) if scale is None else 1.0 / scale
  divisor = alpha * root if alpha > 0 and form == "pb_relax" else root
  scores = jnp.einsum("bhqd,bhkd->bhqk", q / jnp.asarray(divisor, dtype), k)
  if alpha <= 0:
    return scores.astype(jnp.float32), jnp.zeros(scores.shape[:-1] + (1,), jnp.float32)
  if form == "after_product":
    scores = scores / jnp.asarray(alpha, dtype)
  # Softmax is shift invariant, so the row max carries no gradient.
  row_max = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
  shifted = (scores - row_max).astype(jnp.float32) * alpha
  return shifted, row_max.astype(jnp.float32) * alpha


def grouped_conv1d(x, kernel, groups: int):
  """The grouped 1-D convolution over the sequence with "SAME" padding that
  `lax.conv_general_dilated(..., feature_group_count=groups)` computes, written as one einsum
  over the kernel's taps: y[b, t, g, j] = sum_w sum_c x[b, t + w - left, g, c] K[w, c, g, j].
  XLA partitions an einsum on any mesh; its grouped convolution aborts when the batch and the
  channels are both split over the fsdp axis (XLA:CPU, jax 0.10).

  x: [batch, length, channels]; kernel: [width, channels // groups, channels]."""
  batch, length, channels = x.shape
  width, group_in, _ = kernel.shape
  left = (width - 1) // 2
  padded = jnp.pad(x, ((0, 0), (left, width - 1 - left), (0, 0)))
  taps = jnp.stack([padded[:, w:w + length] for w in range(width)], axis=2)
  taps = taps.reshape(batch, length, width, groups, group_in)
  y = jnp.einsum("blwgc,wcgj->blgj", taps,
                 kernel.reshape(width, group_in, groups, channels // groups))
  return y.reshape(batch, length, channels)


class ConvPositions(nn.Module):
  """wav2vec2/HuBERT/MERT's convolutional relative positions: activation(grouped conv(x)) over
  the sequence, added to x by the caller. It sees both sides of a position: encoders only."""
  cfg: Any

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dtype = cfg.compute_dtype
    group_width = cfg.d_model // cfg.conv_pos_groups
    kernel = param(self, "kernel", xavier_normal(1.0, in_axis=1, out_axis=2),
                   (cfg.conv_pos_width, group_width, cfg.d_model), (None, None, "embed"),
                   role="hidden", fan_in=cfg.conv_pos_width * group_width, fan_scaled=True)
    y = grouped_conv1d(x.astype(dtype), kernel.astype(dtype), cfg.conv_pos_groups)
    y = _plus_bias(self, "bias", y, ("embed",))
    return ACTIVATIONS.get(cfg.activation)(y)


# jax.nn.dot_product_attention's implementation for model.attention_kernel="cudnn" (tests on a
# CPU, which has no cuDNN, set "xla" to check the wiring against the explicit path).
FUSED_IMPLEMENTATION = "cudnn"


def fused_attention(q, k, v, causal: bool, implementation: str | None = None,
                    scale: float | None = None):
  """softmax(q k^T / sqrt(d)) v through one fused kernel (jax.nn.dot_product_attention; on a GPU
  cuDNN's FlashAttention-style kernel, Dao et al. 2022): the [b, h, l, l] scores are never
  written to memory, and the softmax's running statistics are float32 inside the kernel.
  q, k, v are [b, h, l, d] in float16 or bfloat16, as Attention holds them; so is the result.
  `implementation`: jax's ("cudnn", "xla"); None is FUSED_IMPLEMENTATION. `scale`: in place of
  1/sqrt(d) (a parametrization's)."""
  heads_minor = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731  (the function takes [b, l, h, d])
  out = jax.nn.dot_product_attention(heads_minor(q), heads_minor(k), heads_minor(v),
                                     is_causal=causal, scale=scale,
                                     implementation=implementation or FUSED_IMPLEMENTATION)
  return heads_minor(out)


class Attention(nn.Module):
  cfg: Any
  branch_gain: float
  inner_norm: bool = False  # Sub-LN: a norm over the heads' concatenation before `out`
  probe: telemetry.Probe = telemetry.OFF
  qkv_norm: bool = False  # the placement's QKV norm (placements.Placement.qkv_norm)

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dtype = cfg.compute_dtype
    qk_init = projection_init(cfg, 1.0, in_axis=0, out_axis=(1, 2))
    v_init = projection_init(cfg, self.branch_gain, in_axis=0, out_axis=(1, 2))

    q, k, v = (_project(self, x, name, init) for name, init in (
        ("query", qk_init), ("key", qk_init), ("value", v_init)))
    if cfg.qk_norm != "none":
      # QK-norm (Dehghani et al. 2023, ViT-22B; Wortsman et al. 2023): each head's q and k
      # normalised over head_dim, one gain shared by the heads and no bias (a bias on q would
      # add a learned key-content term to every score; flax's normalize_qk has none either).
      q = make_norm(cfg, "query_norm", cfg.qk_norm, axis_name="kv", use_bias=False)(q)
      k = make_norm(cfg, "key_norm", cfg.qk_norm, axis_name="kv", use_bias=False)(k)
    if self.qkv_norm:
      # A placement's QKV norm (HybridNorm, Zhuo et al. 2025, eq. 5: softmax(N(Q) N(K)^T /
      # sqrt(d)) N(V)): each head's q, k and v over head_dim, model.norm with its gain and bias.
      q, k, v = (make_norm(cfg, f"{name}_qkv_norm", axis_name="kv")(y)
                 for name, y in (("query", q), ("key", k), ("value", v)))
    if cfg.attention_kernel == "cudnn" and not (self.probe.stats or self.probe.locate):
      # Telemetry and locate steps read the scores, so they take the explicit path below (the
      # same function; it rounds differently only on those steps).
      return _attention_out(self, x, fused_attention(q, k, v, cfg.causal,
                                          scale=parametrizations.attention_scale(cfg)))
    logits, row_shift = attention_scores(
        q, k, cfg.attention_relax, cfg.attention_relax_form,
        jnp.float32 if cfg.attention_scores_dtype == "float32" else None,
        parametrizations.attention_scale(cfg))
    logits = constrain(logits, ("batch", "heads", "length", "kv_length"))
    telemetry.sow_site(self, self.probe, "attn_scores", logits)
    raw_logits = logits  # what telemetry reports: the scores before any cap
    logits = softcap(logits, cfg.attn_softcap)
    length = x.shape[1]
    allowed = jnp.tril(jnp.ones((length, length), bool)) if cfg.causal else None
    if allowed is not None:
      logits = jnp.where(allowed, logits, -jnp.inf)

    def seen_scores():  # the unshifted, uncapped scores the softmax weighs (masked: -inf)
      seen = raw_logits + row_shift
      return seen if allowed is None else jnp.where(allowed, seen, -jnp.inf)

    telemetry.sow_stat(self, self.probe, "attn_logit_max", lambda: jnp.max(seen_scores()))

    def largest_per_head():  # [heads]: what QK-clip watches (Kimi K2; MaxText, Megatron-LM)
      return jnp.max(seen_scores(), axis=(0, 2, 3))

    telemetry.sow_stat(self, self.probe, "attn_logit_max_per_head", largest_per_head)
    if cfg.qk_clip > 0:  # every step: QK-clip rescales W_q and W_k from it after the update
      self.sow(telemetry.QK_CLIP, "head_logit_max", jax.lax.stop_gradient(largest_per_head()))
    probs = jax.nn.softmax(logits, axis=-1)
    telemetry.sow_stat(self, self.probe, "attn_entropy", lambda: telemetry.row_entropy(probs))
    context = jnp.einsum("bhqk,bhkd->bhqd", probs.astype(dtype), v)
    return _attention_out(self, x, context)

def _project(module, x, name: str, init):
  """x [batch, length, d_model] projected by `module`'s weight `name` (and its bias) to
  heads-major [batch, heads, length, head_dim]. Projected token-major first, as a plain product
  of the tokens by the weights, then moved once to heads-major for the score and context
  products (measurably faster on CPU without transposes). Projected straight to heads-major,
  XLA:CPU computed the product transposed and made two copies per projection: 7% slower at
  benchmarks/throughput.py's S, same bits."""
  cfg = module.cfg
  axes = ("embed", "heads", "kv")
  w = param(module, name, init, (cfg.d_model, cfg.num_heads, cfg.head_dim), axes,
            role="hidden", fan_in=cfg.d_model).astype(cfg.compute_dtype)
  if not cfg.fusion_boundaries:  # other compilers: the program they were measured with
    y = jnp.einsum("bld,dhk->bhlk", x, w)
    return _plus_bias(module, f"{name}_bias", y, axes[1:], dims=(1, 3))
  y = jnp.einsum("bld,dhk->blhk", x, w)
  y = boundary(cfg, _plus_bias(module, f"{name}_bias", y, axes[1:], dims=(2, 3)))
  return y.transpose(0, 2, 1, 3)


def _attention_out(module, x, context):
  """The heads' outputs [b, h, l, d] joined and projected back to the residual stream
  (`module`: the Attention, whose parameters these are)."""
  cfg = module.cfg
  dtype = cfg.compute_dtype
  batch, length = x.shape[0], x.shape[1]
  wo = param(module, "out", projection_init(cfg, module.branch_gain, in_axis=(0, 1), out_axis=2),
             (cfg.num_heads, cfg.head_dim, cfg.d_model), ("heads", "kv", "embed"),
             role="hidden", fan_in=cfg.d_model)
  if (multiplier := parametrizations.attention_output_multiplier(cfg)) != 1.0:
    context = context * jnp.asarray(multiplier, context.dtype)
  if module.inner_norm:
    joined = context.transpose(0, 2, 1, 3).reshape(batch, length, cfg.d_model)
    joined = make_norm(cfg, "inner_norm")(joined)
    out = jnp.einsum("bld,de->ble", joined,
                     wo.reshape(cfg.d_model, cfg.d_model).astype(dtype))
  else:
    out = jnp.einsum("bhlk,hkd->bld", context, wo.astype(dtype))
  out = boundary(cfg, _plus_bias(module, "out_bias", out, ("embed",)))
  telemetry.sow_site(module, module.probe, "attn_out", out)
  return out


class Mlp(nn.Module):
  cfg: Any
  branch_gain: float
  inner_norm: bool = False  # Sub-LN: a norm before fc2
  probe: telemetry.Probe = telemetry.OFF

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dtype = cfg.compute_dtype
    init = projection_init(cfg, self.branch_gain)
    w1 = param(self, "fc1", init, (cfg.d_model, cfg.d_ff), ("embed", "mlp"), role="hidden",
               fan_in=cfg.d_model)
    w2 = param(self, "fc2", init, (cfg.d_ff, cfg.d_model), ("mlp", "embed"), role="hidden",
               fan_in=cfg.d_ff)
    h = boundary(cfg, _plus_bias(self, "fc1_bias", widening_product(cfg, x, w1.astype(dtype)),
                                 ("mlp",)))
    telemetry.sow_site(self, self.probe, "mlp_preact", h)
    telemetry.sow_stat(self, self.probe, "mlp_preact_absmax", lambda: telemetry.absmax(h))
    h = ACTIVATIONS.get(cfg.activation)(h)
    if (multiplier := parametrizations.activation_multiplier(cfg)) != 1.0:
      h = h * jnp.asarray(multiplier, h.dtype)
    if self.inner_norm:
      h = make_norm(cfg, "inner_norm", axis_name="mlp")(h)
    out = boundary(cfg, _plus_bias(self, "fc2_bias",
                                   jnp.einsum("blf,fd->bld", h, w2.astype(dtype)), ("embed",)))
    telemetry.sow_site(self, self.probe, "mlp_out", out)
    return out


def _layer_context(module, index, prefix: str, placement, shared: dict):
  """The placements.LayerContext a placement's wrap sees for sublayer `prefix` of the Block
  `module`: its own parameters (`param`) and the layer's, shared by both sublayers
  (`layer_param`, kept in `shared`)."""
  cfg = module.cfg

  def sublayer_param(name, shape, value):
    return param(module, f"{prefix}_{name}", nn.initializers.constant(value), shape,
                 ("embed",) * len(shape), decay=False)

  def layer_param(name, shape, value):
    if name not in shared:
      shared[name] = param(module, name, nn.initializers.constant(value), shape,
                           ("embed",) * len(shape), decay=False)
    return shared[name]
  return placements.LayerContext(
      index=index, num_layers=cfg.num_layers, causal=cfg.causal,
      alpha=placement.residual_alpha(cfg.num_layers), cfg=cfg, param=sublayer_param,
      layer_param=layer_param, sublayer=prefix)


def _sublayer_norms(module, index, prefix: str):
  """norm(slot) -> the Block `module`'s norm of sublayer `prefix` for `slot` ("in", "out"),
  created on first use, with its telemetry and LayerNorm Scaling."""
  cfg = module.cfg

  def norm(slot):
    made = make_norm(cfg, f"{prefix}_norm" if slot == "in" else f"{prefix}_{slot}_norm")

    def normed(h):
      if slot == "in":
        # What the sublayer's norm is given (Post-LN: alpha x + F(x), whose growth with
        # depth DeepNet follows; Pre-LN: the residual stream itself).
        telemetry.sow_stat(module, module.probe, f"{'attn' if prefix == 'attention' else prefix}"
                           "_norm_input_rms", lambda: telemetry.rms(h))
      out = made(h)
      if cfg.layernorm_scaling:
        # LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth", eq. 9): layer l's
        # norms' outputs times 1/sqrt(l), l = index + 1 (traced under nn.scan).
        out = out * jax.lax.rsqrt(jnp.asarray(index, jnp.float32) + 1.0).astype(out.dtype)
      return out
    return normed
  return norm


class Block(nn.Module):
  """One transformer layer; the placement decides where the norms and residuals go."""
  cfg: Any
  deterministic: bool = True
  probe: telemetry.Probe = telemetry.OFF

  @nn.compact
  def __call__(self, x, index=0):
    cfg = self.cfg
    x = constrain(x, ("batch", "length", "act_embed"))
    placement = placements.get(cfg.placement)
    gain = placement.branch_gain(cfg.num_layers)

    shared = {}  # the layer's own parameters, shared by its two sublayers

    def context(prefix):
      return _layer_context(self, index, prefix, placement, shared)

    def norms_of(prefix):
      return _sublayer_norms(self, index, prefix)

    def branch(f, prefix):
      def dropped(h):
        return nn.Dropout(cfg.dropout)(f(h), deterministic=self.deterministic)
      if cfg.layer_scale <= 0:
        return dropped
      # LayerScale (Touvron et al. 2021, CaiT, eq. 3): x + diag(g) F(...), g learned per
      # channel, initialised to a small constant, not decayed.
      scale = param(self, f"{prefix}_layer_scale", nn.initializers.constant(cfg.layer_scale),
                    (cfg.d_model,), ("embed",), decay=False)
      return lambda h: dropped(h) * scale.astype(h.dtype)

    per_layer = parametrizations.branches_per_layer(cfg)

    def wrap(x, f, prefix, position):
      """The placement's wrap of branch `position` of this layer, under the parametrization's
      residual scales (x <- skip x + b F(x), as skip (x + (b / skip) F(x)), so the placement's
      wiring is untouched)."""
      scales = parametrizations.residual_scales(cfg, index * per_layer + position)
      if scales is None:
        return placement.wrap(x, branch(f, prefix), norms_of(prefix), context(prefix))
      multiplier, skip = scales
      inner = branch(f, prefix)
      scaled = lambda h: inner(h) * jnp.asarray(multiplier / skip).astype(h.dtype)  # noqa: E731
      x = placement.wrap(x, scaled, norms_of(prefix), context(prefix))
      return x if isinstance(skip, float) and skip == 1.0 else x * jnp.asarray(skip).astype(
          x.dtype)

    mlp = Mlp(cfg, gain, "mlp" in placement.inner_norm, self.probe, name="mlp")
    if cfg.attention != "none":
      attention = Attention(cfg, gain, "attention" in placement.inner_norm, self.probe,
                            qkv_norm=placement.qkv_norm, name="attention")
      x = wrap(x, attention, "attention", 0)
    telemetry.sow_site(self, self.probe, "resid_attn", x)
    x = wrap(x, mlp, "mlp", per_layer - 1)
    telemetry.sow_site(self, self.probe, "resid_mlp", x)
    telemetry.sow_stat(self, self.probe, "act_rms", lambda: telemetry.rms(x))
    telemetry.sow_stat(self, self.probe, "resid_absmax", lambda: telemetry.absmax(x))
    return boundary(cfg, x)


class ScanBlock(Block):
  """Block with the (carry, xs) -> (carry, ys) signature nn.scan needs; xs is the layer index."""

  def __call__(self, x, index):
    return super().__call__(x, index), None
