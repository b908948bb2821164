"""The norm-placement factory: where a transformer block puts its normalisation.

A placement owns its whole behaviour in one registered definition: how each sublayer (attention,
MLP) is wrapped with norms and the residual (`wrap`), whether the stack starts with a norm on the
embedding output and ends with a final norm, whether attention and the MLP get a norm inside
(before their output projection), the residual weight alpha and the initial gain of the
residual-branch weights. `wrap` sees a `LayerContext`: the layer's index (a Python int, or a traced
int32 scalar when layers are scanned, so index-dependent wiring uses `jnp.where`), the number of
layers, causality and the model config.

Options that combine with any placement (QK-norm, attention relax, z-loss, LayerScale, ...) are
config fields, not placements. To add a placement: write its `wrap`, `register(Placement(...))`,
and add its numpy reference to `tests/numpy_reference.py` (BLOCKS).
"""

import dataclasses
import math
from typing import Any, Callable

from normstudy.core.registry import Registry

# JAX is imported where a wrap computes, not here: validation, the legend and the schema read
# this table's properties before a command may load JAX (a mistyped config is refused first).
Array = Any
# norm(slot) returns the sublayer's norm for `slot` ("in" or "out"), created on first use.
NormFactory = Callable[[str], Callable[[Array], Array]]
Sublayer = Callable[[Array], Array]


@dataclasses.dataclass(frozen=True)
class LayerContext:
  """What a placement may know about the layer it wraps."""
  index: Any  # int, or a traced int32 scalar under nn.scan
  num_layers: int
  causal: bool
  alpha: float  # this placement's residual weight for the stack
  cfg: Any = None  # the ModelConfig, for placement-specific fields
  sublayer: str = ""  # the branch wrapped: "attention" or "mlp"
  # param(name, shape, init value) -> a learned float32 parameter of this sublayer, not decayed;
  # created on first use. layer_param: the same, shared by the layer's two sublayers (ReZero).
  param: Callable[[str, tuple, float], Array] | None = None
  layer_param: Callable[[str, tuple, float], Array] | None = None


@dataclasses.dataclass(frozen=True)
class Placement:
  name: str
  # wrap(x, f, norm, ctx) -> the residual stream after sublayer f.
  wrap: Callable[[Array, Sublayer, NormFactory, LayerContext], Array]
  final_norm: bool
  label: str  # how legends name it ("Pre-Norm", "Post-Norm | DeepNorm")
  embedding_norm: bool = False  # a norm on the embedding output before layer 0
  # Whether the residual stream passes from layer to layer untouched (x + F(...)); False when it
  # goes through a norm (Post-LN family), which decides how the stack compiles best.
  identity_residual: bool = True
  # The sublayers with a norm inside, before their output projection: "attention" (over the
  # heads' concatenation, before `out`) and "mlp" (after the activation, before fc2).
  inner_norm: tuple[str, ...] = ()
  # num_layers -> residual weight alpha; 1 for plain residuals.
  residual_alpha: Callable[[int], float] = lambda num_layers: 1.0
  # num_layers -> init gain of value, out, fc1 and fc2 (query and key keep 1).
  branch_gain: Callable[[int], float] = lambda num_layers: 1.0
  # nGPT's hypersphere (Loshchilov et al. 2024): the model puts the embedding output on the unit
  # sphere and scales the logits by a learned s_z (normstudy.core.model), and every matrix is
  # renormalised along its embedding axis at init and after each update
  # (normstudy.core.model.onto_sphere, normstudy.core.steps).
  unit_sphere: bool = False
  # Whether its blocks have norm modules (model.norm, LayerNorm Scaling and DyT act on them):
  # ReZero and nGPT have none.
  has_norms: bool = True
  # What it already scales each branch by, learned ("scalar": ReZero's a; "alpha": nGPT's
  # eigen learning rates), so LayerScale would be a second one; None when nothing.
  branch_scale: str | None = None
  # Whether depth-wise parametrizations (CompleteP, u-muP: residual branches scaled by depth as
  # derived for x + F(LN(x))) apply to its wiring.
  depth_parametrizable: bool = False
  # Queries, keys and values each normalised per head over head_dim by the placement's norm
  # (model.norm) inside attention (HybridNorm's QKV norm), before the scores.
  qkv_norm: bool = False
  # docs/reference.md's placement table is made of these (markdown_table; tests/test_docs.py).
  paper: str = ""  # where the block comes from
  description: str = ""  # the block, in Markdown


REGISTRY: Registry[Placement] = Registry("model.placement")


def register(placement: Placement) -> Placement:
  unknown = (set(placement.inner_norm) - {"attention", "mlp"}
             if isinstance(placement.inner_norm, tuple) else {placement.inner_norm})
  if unknown:
    raise ValueError(f"placement {placement.name!r}: inner_norm names {sorted(unknown)}; "
                     "allowed: 'attention', 'mlp'")
  return REGISTRY.register(placement.name, placement)


def names() -> tuple[str, ...]:
  return REGISTRY.names()


def get(name: str) -> Placement:
  return REGISTRY.get(name)


def markdown_table() -> str:
  """docs/reference.md's table of the registered placements, in the order registered."""
  rows = ["| name | block | final norm | paper |", "| --- | --- | --- | --- |"]
  rows += [f"| `{p.name}` | {p.description} | {'yes' if p.final_norm else 'no'} | {p.paper} |"
           for p in REGISTRY.registered()]
  return "\n".join(rows)


def _pre_ln(x, f, norm, ctx):
  return x + f(norm("in")(x))


def _post_ln(x, f, norm, ctx):
  return norm("in")(ctx.alpha * x + f(x))


def _sandwich_ln(x, f, norm, ctx):
  return x + norm("out")(f(norm("in")(x)))


def _reordered_ln(x, f, norm, ctx):
  """x + LN(F(x)): the norm on the sublayer's output, none on its input (OLMo 2, Team OLMo
  2024, "2 OLMo 2 Furious", section 3.2.1: "reordered norm"; OLMo-core's `reordered_norm` block,
  there with RMSNorm and QK-norm, both separate fields here)."""
  del ctx
  return x + norm("in")(f(x))


def _normformer(x, f, norm, ctx):
  """NormFormer (Shleifer et al. 2021, figure 1, without HeadScale): Pre-LN with a LN on the
  attention's output before the residual sum; the MLP's own LN after its activation is the
  placement's inner_norm=("mlp",)."""
  h = f(norm("in")(x))
  return x + (norm("out")(h) if ctx.sublayer == "attention" else h)


def _hybrid_norm(x, f, norm, ctx):
  """HybridNorm (Zhuo et al. 2025, "HybridNorm", eqs. 5-7): attention with its queries, keys and
  values normalised (the placement's qkv_norm) on the stream as it is, Y = X + MHA_QKV(X); the
  FFN Post-Norm, X' = FFN(Norm(Y)) + Norm(Y)."""
  if ctx.sublayer == "attention":
    return x + f(x)
  h = norm("in")(x)
  return h + f(h)


def _mix_ln(x, f, norm, ctx):
  """Post-LN in the first ceil(fraction * N) layers, Pre-LN after (Li et al. 2024, "Mix-LN",
  alpha = 0.25). Under nn.scan the layer index is traced: the sublayer runs once on the input
  the layer's kind chooses, and the output is chosen the same way."""
  post = ctx.index < mix_ln_post_layers(ctx.num_layers, ctx.cfg.mix_ln_fraction)
  if isinstance(post, bool):
    return _post_ln(x, f, norm, ctx) if post else _pre_ln(x, f, norm, ctx)
  n = norm("in")
  y = f(where_layer(post, x, n(x)))
  return where_layer(post, n(x + y), x + y)


def mix_ln_post_layers(num_layers: int, fraction: float) -> int:
  """How many of the first layers Mix-LN makes Post-LN: ceil(fraction * N)."""
  return math.ceil(fraction * num_layers)


def _rezero(x, f, norm, ctx):
  """x + a F(x), a a learned scalar initialised to 0, no norms (Bachlechner et al. 2020); one
  `a` per layer, shared by its attention and MLP sublayers, as the authors' rztx.py does
  (`self.resweight` in RZTXEncoderLayer)."""
  del norm
  return x + ctx.layer_param("rezero", (), 0.0).astype(x.dtype) * f(x)


# nGPT's eigen learning rates (Loshchilov et al. 2024, section 2.3 and Table 1): alpha is stored
# as a parameter initialised to alpha_scale = 1/sqrt(d_model) and used times
# alpha_init / alpha_scale, so its value starts at alpha_init = 0.05 while Adam's steps on it
# are scaled by that factor. The logit scale s_z the same way (s_z_init = 1).
NGPT_ALPHA_INIT = 0.05
NGPT_LOGIT_SCALE_INIT = 1.0


def unit(x: Array, axis: int = -1) -> Array:
  """x / ||x|| over `axis` (nGPT's Norm), computed in float32; x's dtype."""
  import jax
  import jax.numpy as jnp
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=axis, keepdims=True))).astype(x.dtype)


def ngpt_scaled(stored: Array, init: float, d_model: int) -> Array:
  """An nGPT scaling parameter's value from its stored form: stored * init / scale, with
  scale = 1/sqrt(d_model) (what the stored form is initialised to)."""
  return stored * (init * math.sqrt(d_model))


def _ngpt(x, f, norm, ctx):
  """h <- Norm(h + alpha (Norm(F(h)) - h)), Norm onto the unit sphere, alpha a learned
  per-channel eigen learning rate (Loshchilov et al. 2024, "nGPT", eqs. 10-11); no LayerNorm
  anywhere: F sees h itself, already on the sphere. OLMo-core's `normalized` block. The
  sphere's arithmetic is float32 (as the norms' statistics); the stream keeps x's dtype."""
  del norm
  d = x.shape[-1]
  alpha = ngpt_scaled(ctx.param("ngpt_alpha", (d,), 1.0 / math.sqrt(d)), NGPT_ALPHA_INIT, d)
  import jax.numpy as jnp
  x32 = x.astype(jnp.float32)
  return unit(x32 + alpha * (unit(f(x)).astype(jnp.float32) - x32)).astype(x.dtype)


def sub_ln_gain(num_layers: int) -> float:
  """Magneto's init gain for value, out, fc1 and fc2: sqrt(log(2N)) (Wang et al. 2022,
  "Foundation Transformers", section 2.2)."""
  return math.sqrt(math.log(2.0 * num_layers))


def deepnorm_alpha(num_layers: int) -> float:
  """DeepNet's residual weight for a decoder-only or encoder-only stack of N layers: (2N)^(1/4).

  Both one-stack cases share the formula (Wang et al. 2022, "DeepNet", Table 1). For an
  encoder-decoder with N encoder and M decoder layers (not built here) the paper gives: encoder
  alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16); decoder alpha = (3M)^(1/4),
  beta = (12M)^(-1/4).
  """
  return (2.0 * num_layers) ** 0.25


def deepnorm_beta(num_layers: int) -> float:
  """DeepNet's init gain for value, out, fc1, fc2 of a one-stack model: (8N)^(-1/4)."""
  return (8.0 * num_layers) ** -0.25


register(Placement(
    name="pre_ln", wrap=_pre_ln, final_norm=True, label="Pre-Norm", depth_parametrizable=True,
    paper="Xiong et al. 2020",
    description="`x + F(LN(x))`"))
register(Placement(
    name="post_ln", wrap=_post_ln, final_norm=False, label="Post-Norm", identity_residual=False,
    paper="Vaswani et al. 2017",
    description="`LN(x + F(x))`"))
register(Placement(
    name="deepnorm", wrap=_post_ln, final_norm=False, label="Post-Norm | DeepNorm",
    identity_residual=False,
    residual_alpha=deepnorm_alpha, branch_gain=deepnorm_beta,
    paper="Wang et al. 2022 (DeepNet)",
    description=("`LN(alpha x + F(x))`, alpha = (2N)^(1/4); value, out, fc1, fc2 initialised with "
                 "gain beta = (8N)^(-1/4)")))
register(Placement(
    name="sandwich_ln", wrap=_sandwich_ln, final_norm=True, label="Sandwich-LN",
    paper="Ding et al. 2021 (CogView)",
    description="`x + LN_out(F(LN_in(x)))`"))
register(Placement(
    name="sub_ln", wrap=_pre_ln, final_norm=True, label="Sub-LN",
    inner_norm=("attention", "mlp"),
    branch_gain=sub_ln_gain,
    paper="Wang et al. 2022 (Magneto)",
    description=("Pre-LN plus a LN before attention's output projection and before fc2; value, "
                 "out, fc1, fc2 initialised with gain sqrt(log 2N)")))
register(Placement(
    name="peri_ln", wrap=_sandwich_ln, final_norm=True, label="Peri-LN", embedding_norm=True,
    paper="Kim et al. 2025 (Peri-LN)",
    description=("`x + LN_out(F(LN_in(x)))` and a LN on the embedding output "
                 "(`model.peri_ln_embedding_norm`, default True)")))
register(Placement(
    name="reordered_ln", wrap=_reordered_ln, final_norm=True, label="Reordered-Norm",
    paper="Team OLMo 2024 (OLMo 2)",
    description="`x + LN(F(x))`, the norm on the branch's output only (OLMo 2's reordered norm)"))
register(Placement(
    name="mix_ln", wrap=_mix_ln, final_norm=True, label="Mix-LN", identity_residual=False,
    paper="Li et al. 2024 (Mix-LN)",
    description="Post-LN in the first ceil(`mix_ln_fraction` N) layers, Pre-LN after"))
register(Placement(
    name="normformer", wrap=_normformer, final_norm=True, label="NormFormer",
    inner_norm=("mlp",), paper="Shleifer et al. 2021 (NormFormer)",
    description=("`x + LN_out(MHA(LN(x)))`, then `x + fc2(LN(act(fc1(LN(x)))))`; without "
                 "HeadScale")))
register(Placement(
    name="hybrid_norm", wrap=_hybrid_norm, final_norm=True, label="HybridNorm",
    identity_residual=False, qkv_norm=True,
    paper="Zhuo et al. 2025 (HybridNorm)",
    description=("`y = x + MHA(x)` with each head's q, k and v normalised (`model.norm`, gain and "
                 "bias), then `Norm(y) + FFN(Norm(y))` (`model.qk_norm` is refused beside it)")))
register(Placement(
    name="rezero", wrap=_rezero, final_norm=False, label="ReZero", has_norms=False,
    branch_scale="scalar",
    paper="Bachlechner et al. 2020 (ReZero)",
    description=("`x + a F(x)`, `a` a learned scalar per layer (shared by its two sublayers, as "
                 "the authors' `rztx.py`) initialised to 0; no norms")))
register(Placement(
    name="ngpt", wrap=_ngpt, final_norm=False, label="nGPT", identity_residual=False,
    unit_sphere=True, has_norms=False, branch_scale="alpha",
    paper="Loshchilov et al. 2024 (nGPT)",
    description=("`h <- Norm(h + alpha (Norm(F(h)) - h))`, Norm onto the unit sphere (`x / "
                 "||x||`), alpha a learned per-channel vector starting at 0.05; the embedding "
                 "output on the sphere, logits times a learned per-token `s_z` starting at 1, "
                 "every matrix renormalised along d_model at init and after each update; no "
                 "LayerNorm")))


def where_layer(condition, a: Array, b: Array) -> Array:
  """`a` where the (possibly traced) layer condition holds, else `b`; static when it is a bool."""
  if isinstance(condition, bool):
    return a if condition else b
  import jax.numpy as jnp
  return jnp.where(condition, a, b)
