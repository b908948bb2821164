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
and add its numpy reference to `tests/reference_blocks.py`.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from normstudy.registry import Registry

Array = jax.Array
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
  inner_norm: bool = False  # a norm before attention's output projection and before fc2
  # num_layers -> residual weight alpha; 1 for plain residuals.
  residual_alpha: Callable[[int], float] = lambda num_layers: 1.0
  # num_layers -> init gain of value, out, fc1 and fc2 (query and key keep 1).
  branch_gain: Callable[[int], float] = lambda num_layers: 1.0
  description: str = ""


REGISTRY: Registry[Placement] = Registry("model.placement")


def register(placement: Placement) -> Placement:
  return REGISTRY.register(placement.name, placement)


def names() -> tuple[str, ...]:
  return REGISTRY.names()


def get(name: str) -> Placement:
  return REGISTRY.get(name)


def _pre_ln(x, f, norm, ctx):
  return x + f(norm("in")(x))


def _post_ln(x, f, norm, ctx):
  return norm("in")(ctx.alpha * x + f(x))


def _sandwich_ln(x, f, norm, ctx):
  return x + norm("out")(f(norm("in")(x)))


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
    name="pre_ln", wrap=_pre_ln, final_norm=True, label="Pre-Norm",
    description="x + F(LN(x)); one final LN before the head (Xiong et al. 2020)."))
register(Placement(
    name="post_ln", wrap=_post_ln, final_norm=False, label="Post-Norm", identity_residual=False,
    description="LN(x + F(x)), the original Transformer; needs LR warm-up."))
register(Placement(
    name="deepnorm", wrap=_post_ln, final_norm=False, label="Post-Norm | DeepNorm",
    identity_residual=False,
    residual_alpha=deepnorm_alpha, branch_gain=deepnorm_beta,
    description="LN(alpha x + F(x)) with beta-scaled branch init (DeepNet, Wang et al. 2022)."))
register(Placement(
    name="sandwich_ln", wrap=_sandwich_ln, final_norm=True, label="Sandwich-LN",
    description="x + LN_out(F(LN_in(x))) (CogView, Ding et al. 2021)."))


def where_layer(condition, a: Array, b: Array) -> Array:
  """`a` where the (possibly traced) layer condition holds, else `b`; static when it is a bool."""
  if isinstance(condition, bool):
    return a if condition else b
  return jnp.where(condition, a, b)
