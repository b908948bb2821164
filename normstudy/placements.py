"""The norm-placement factory: where a transformer block puts its normalisation.

A placement owns its whole behaviour in one registered definition: how each sublayer (attention, MLP)
is wrapped with norms and the residual, whether the stack ends with a final norm, the residual
weight alpha and the initial gain of the residual-branch weights. To add one, write its `wrap`
function, call `register(Placement(...))`, and add a row to the placement table in
`tests/test_model.py`.
"""

import dataclasses
from typing import Callable

import jax

Array = jax.Array
# norm(slot) returns a norm module owned by the sublayer; slot "in" or "out" picks which one.
NormFactory = Callable[[str], Callable[[Array], Array]]
Sublayer = Callable[[Array], Array]


@dataclasses.dataclass(frozen=True)
class Placement:
  name: str
  # wrap(x, f, norm, alpha) -> the residual stream after sublayer f.
  wrap: Callable[[Array, Sublayer, NormFactory, float], Array]
  final_norm: bool
  # (num_layers, causal) -> residual weight alpha; 1 for plain residuals.
  residual_alpha: Callable[[int, bool], float] = lambda num_layers, causal: 1.0
  # (num_layers, causal) -> Xavier-normal gain of value, out, fc1 and fc2 (query and key keep 1).
  branch_gain: Callable[[int, bool], float] = lambda num_layers, causal: 1.0
  description: str = ""


_REGISTRY: dict[str, Placement] = {}


def register(placement: Placement) -> Placement:
  if placement.name in _REGISTRY:
    raise ValueError(f"placement {placement.name!r} is already registered")
  _REGISTRY[placement.name] = placement
  return placement


def names() -> tuple[str, ...]:
  return tuple(sorted(_REGISTRY))


def get(name: str) -> Placement:
  try:
    return _REGISTRY[name]
  except KeyError:
    raise ValueError(
        f"unknown placement {name!r}; registered placements: {', '.join(names())}") from None


def _pre_ln(x, f, norm, alpha):
  return x + f(norm("in")(x))


def _post_ln(x, f, norm, alpha):
  return norm("in")(alpha * x + f(x))


def _sandwich_ln(x, f, norm, alpha):
  return x + norm("out")(f(norm("in")(x)))


def deepnorm_alpha(num_layers: int, causal: bool) -> float:
  """DeepNet's residual weight for a decoder-only or encoder-only stack of N layers: (2N)^(1/4).

  Both one-stack cases share the formula. For an encoder-decoder with N encoder and M decoder
  layers (not built here) the paper gives: encoder alpha = 0.81 (N^4 M)^(1/16),
  beta = 0.87 (N^4 M)^(-1/16); decoder alpha = (3M)^(1/4), beta = (12M)^(-1/4).
  """
  del causal
  return (2.0 * num_layers) ** 0.25


def deepnorm_beta(num_layers: int, causal: bool) -> float:
  """DeepNet's init gain for value, out, fc1, fc2 of a one-stack model: (8N)^(-1/4)."""
  del causal
  return (8.0 * num_layers) ** -0.25


register(Placement(
    name="pre_ln", wrap=_pre_ln, final_norm=True,
    description="x + F(LN(x)); one final LN before the head."))
register(Placement(
    name="post_ln", wrap=_post_ln, final_norm=False,
    description="LN(x + F(x)), the original Transformer; needs LR warm-up."))
register(Placement(
    name="deepnorm", wrap=_post_ln, final_norm=False,
    residual_alpha=deepnorm_alpha, branch_gain=deepnorm_beta,
    description="LN(alpha x + F(x)) with beta-scaled branch init (DeepNet, Wang et al. 2022)."))
register(Placement(
    name="sandwich_ln", wrap=_sandwich_ln, final_norm=True,
    description="x + LN_out(F(LN_in(x))) (CogView)."))
