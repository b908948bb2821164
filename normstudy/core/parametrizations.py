"""Parametrizations (model.parametrization): how initialisation, forward multipliers and
per-parameter learning rates scale with width and depth, so that a learning rate tuned on a small
model transfers to a large one.

Every parameter declares its role where it is created (normstudy.core.layers.param):
  embedding  the token and learned position tables and the mask embedding (fan-in: the vocabulary)
  hidden     the blocks' matrices (q, k, v, out, fc1, fc2) and the position convolution's kernel
  readout    the untied output head (a tied head is the embedding's transpose, with the
             readout's forward multiplier)
  vector     norm gains and biases, projection biases, LayerScale and the placements' scalars
A parameter inside a block is `in_block` (what u-muP's depth rule scales). The width multiplier is
m_N = d_model / base_width, the depth multiplier m_L = num_layers / base_depth.

  sp        the standard parametrization: the code as it was (init by model.init and the
            placement's gain, one learning rate, attention 1/sqrt(d_head)).
  mup       muP for Adam (Yang et al. 2022, "Tensor Programs V", Table 8, the form the `mup`
            package implements, with Table 3's attention rule): hidden matrices initialised with
            variance proportional to 1/fan_in (model.init="xavier" already is, and so is the
            position convolution's Xavier kernel under either init; "bert"'s normal(0.02) is
            multiplied by m_N^-1/2) and their Adam learning rate times 1/m_N; the
            output logits times 1/m_N (MuReadout; MuSharedReadout when tied); attention logits
            q.k / d_head times sqrt(base_head_dim) (Table 3's 1/d, equal to sp's 1/sqrt(d_head)
            at the base head width); embeddings, vectors and the readout keep the base rate.
  completep muP in width plus CompleteP's depth rules at alpha = 1 (Dey et al. 2025, "Don't be
            lazy: CompleteP enables compute-efficient deep transformers", Table 1): each residual
            branch times 1/m_L; the hidden matrices' learning rate m_N^-1 m_L^(alpha-1) = m_N^-1
            and Adam's epsilon times m_N^-1 m_L^-alpha for every parameter (the reference
            scales the optimizer's one epsilon); initialisation and the vectors' rates as
            muP's. Pre-LN only (the table is derived for x + F(LN(x))).
  umup      u-muP (Blake et al. 2024, "u-muP: The Unit-Scaled Maximal Update Parametrization",
            Table 2 and its residual and operation scales; unit scaling, Blake et al. 2023): every
            matrix initialised N(0, 1); hidden matrices used times fan_in^-1/2 with Adam rate
            fan_in^-1/2, the readout times 1/fan_in (rate 1), embeddings times 1 with rate
            d_model^-1/2; inside blocks every rate times num_layers^-1/2; attention logits
            q.k / d_head and its output divided by the attention's empirical scale; GELU's output
            times its unit scale; the residual stream mixed by the tau rule (skip and branch scales
            with skip^2 + branch^2 = 1, so the stream stays at unit scale); and the loss's gradient
            scaled to unit size in the backward pass (the cross entropy's V / sqrt(V - 1) per
            token, the mean's 1/N undone), undone exactly in float32 before the clip, so
            float16 gradients sit near 1 without a loss scaler (optimizer.loss_scale.kind=none).
            No base shapes: u-muP's rules are absolute. Pre-LN, untied head. Not reproduced: the
            readout's separate backward scale (1/sqrt(fan_out); its gradient here is its forward
            multiplier's) and the weights' gradient multipliers (Adam sees the true gradient).

Weight decay, for every parametrization, is independent of the per-parameter rates (Wang &
Aitchison 2025, "How to set AdamW's weight decay as you scale model and dataset size"): the
multipliers scale Adam's direction only, so lr x weight_decay, the decay's timescale
tau = 1 / (lr x weight_decay), is the same for every parameter at every width (CompleteP's table
scales the decay by m_N for the same reason).
"""

import dataclasses
import math

from normstudy.core import registry

ROLES = ("embedding", "hidden", "readout", "vector")


@dataclasses.dataclass(frozen=True)
class Parametrization:
  """One parametrization's properties, which the rules below and the config's checks read (no
  code outside this module tests a parametrization by its name).

  label         its part of a run's label ("" for sp)
  changes       what it changes (docs/reference.md's table, generated: markdown_table)
  base_shape    the config fields its base shape is read from
  width_rules   muP's width rules: hidden init and rate, readout multiplier (mup, completep)
  depth_rules   CompleteP's residual branches times 1/m_L and Adam's epsilon (completep)
  unit_scaled   u-muP's unit scales: N(0, 1) init, fan-in multipliers, the tau residual rule,
                the loss's backward scale, float16 without a loss scaler (umup)
  pre_ln_only   its residual rules are derived for x + F(LN(x))
  untied_head   its embedding and readout scale differently: model.tie_embeddings=False
  rate_scale    a rate under it is about this many times sp's at the base shape (coordcheck's
                default rate when none is given: u-muP's unit-scaled rates are ~100x)"""
  name: str
  label: str
  changes: str
  base_shape: str = "none"
  width_rules: bool = False
  depth_rules: bool = False
  unit_scaled: bool = False
  pre_ln_only: bool = False
  untied_head: bool = False
  rate_scale: float = 1.0


REGISTRY: registry.Registry[Parametrization] = registry.Registry("model.parametrization")
for _p in (
    Parametrization("sp", "", "nothing: the code as it was"),
    Parametrization(
        "mup", "muP",
        "muP for Adam (Yang et al. 2022, Tensor Programs V, Table 8): hidden matrices' rate x "
        "base_width / d_model (and \"bert\"'s init std x sqrt(base_width / d_model); the "
        "position convolution's Xavier kernel is 1/fan_in already and kept), logits x "
        "base_width / d_model (an untied head's Xavier init x sqrt(d_model / base_width), as "
        "`mup`'s MuReadout rescales it; bert's 0.02 is kept), attention q.k x "
        "sqrt(base_head_dim) / d_head",
        base_shape="`model.base_width`, `model.base_head_dim` (0: each model's own head width)",
        width_rules=True),
    Parametrization(
        "completep", "CompleteP",
        "muP plus CompleteP at alpha = 1 (Dey et al. 2025, Table 1): each residual branch x "
        "base_depth / num_layers, Adam's epsilon x 1 / (m_N m_L) on every parameter (as the "
        "reference scales its one epsilon); Pre-LN only",
        base_shape="`model.base_width`, `model.base_depth`", width_rules=True,
        depth_rules=True, pre_ln_only=True),
    Parametrization(
        "umup", "u-muP",
        "u-muP (Blake et al. 2024, Table 2): unit-variance weights, hidden matrices used x "
        "fan_in^-1/2 (rate x fan_in^-1/2), readout x 1/fan_in, embedding rate x d^-1/2, rates "
        "inside blocks x L^-1/2, attention q.k / d_head and its output (by unit_scaling's "
        "rule: causal or not) and GELU at unit scale, the residual by the tau rule, the loss's "
        "gradient scaled to unit size in the backward pass (undone in float32 before the "
        "clip); Pre-LN, untied head",
        unit_scaled=True, pre_ln_only=True, untied_head=True, rate_scale=100.0),
):
  REGISTRY.register(_p.name, _p)
# The parametrizations' names, in the order registered (the schema's); sp is the default.
NAMES = tuple(p.name for p in REGISTRY.registered())


def get(name: str) -> Parametrization:
  """The registered parametrization `name` (a one-line error naming the allowed ones)."""
  return REGISTRY.get(name)


def _of(cfg) -> Parametrization:
  return REGISTRY.get(cfg.parametrization)


def markdown_table() -> str:
  """docs/reference.md's table of the registered parametrizations, in the order registered."""
  rows = ["| value | what it changes | base shape |", "| --- | --- | --- |"]
  rows += [f"| `{p.name}`{' (default)' if i == 0 else ''} | {p.changes} | {p.base_shape} |"
           for i, p in enumerate(REGISTRY.registered())]
  return "\n".join(rows)


def width_mult(cfg) -> float:
  """m_N = d_model / base_width."""
  return cfg.d_model / cfg.base_width


def depth_mult(cfg) -> float:
  """m_L = num_layers / base_depth."""
  return cfg.num_layers / cfg.base_depth


def _width_rules(cfg) -> bool:
  return _of(cfg).width_rules


def unit_init(cfg, role: str) -> bool:
  """Whether a parameter of `role` is initialised N(0, 1) (u-muP's matrices) in place of its
  sp initialiser."""
  return _of(cfg).unit_scaled and role in ("embedding", "hidden", "readout")


def init_multiplier(cfg, role: str, fan_scaled: bool = False) -> float:
  """The factor on a parameter's sp initialiser (muP: a hidden matrix's normal(0.02) "bert"
  init times m_N^-1/2, so its variance goes as 1/fan_in as Xavier's already does; an untied
  readout's Xavier init times m_N^1/2, as `mup`'s MuReadout rescales it). A hidden
  matrix whose own initialiser is scaled by its fans whatever model.init says (`fan_scaled`:
  the convolutional positions' Xavier kernel) keeps it: shrunk again, its variance would fall
  as 1/width^2 (`mup`'s rule is variance proportional to 1/fan_in, once)."""
  if _width_rules(cfg) and role == "hidden" and cfg.init == "bert" and not fan_scaled:
    return width_mult(cfg) ** -0.5
  if _width_rules(cfg) and role == "readout" and cfg.init == "xavier":
    # MuReadout's _rescale_parameters: the sp initialiser (scaled by its fan-in) times
    # m_N^1/2, so the untied head's variance stays the base model's as the width grows; bert's
    # normal(0.02) is constant in width already and is kept.
    return width_mult(cfg) ** 0.5
  return 1.0


def forward_multiplier(cfg, role: str, fan_in: int) -> float:
  """The constant a parameter is multiplied by where it is used (its gradient carries the same
  factor): u-muP's fan_in^-1/2 (hidden) and 1/fan_in (readout); muP's 1/m_N on the readout."""
  if _of(cfg).unit_scaled:
    return {"hidden": fan_in ** -0.5, "readout": 1.0 / fan_in}.get(role, 1.0)
  if _width_rules(cfg) and role == "readout":
    return 1.0 / width_mult(cfg)
  return 1.0


def lr_multiplier(cfg, role: str, fan_in: int, in_block: bool) -> float:
  """The factor on the learning rate of one parameter (its Adam direction; module docstring)."""
  if _width_rules(cfg):
    return 1.0 / width_mult(cfg) if role == "hidden" else 1.0
  if _of(cfg).unit_scaled:
    own = {"hidden": fan_in ** -0.5, "embedding": cfg.d_model ** -0.5}.get(role, 1.0)
    return own * (cfg.num_layers ** -0.5 if in_block else 1.0)
  return 1.0


def eps_multiplier(cfg, role: str) -> float:
  """The factor on Adam's epsilon of one parameter: CompleteP's m_N^-1 m_L^-alpha (alpha = 1)
  on every parameter, as its reference scales the optimizer's one epsilon (Dey et al. 2025's
  llm-foundry port: eps *= 1 / width_multiplier x depth_multiplier^-alpha, before the parameter
  groups); 1 otherwise. `role` is every role's the same factor."""
  del role  # one epsilon for every parameter group in the reference
  if _of(cfg).depth_rules:
    return 1.0 / (width_mult(cfg) * depth_mult(cfg))
  return 1.0


def attention_scale(cfg) -> float | None:
  """What q.k is multiplied by before the softmax; None: sp's 1/sqrt(d_head), as the code always
  computed it (the same operations, the same bits)."""
  head_dim = cfg.d_model // cfg.num_heads
  if _width_rules(cfg):
    base = cfg.base_head_dim or head_dim
    return math.sqrt(base) / head_dim
  if _of(cfg).unit_scaled:
    return 1.0 / head_dim
  return None


def _log_interpolation(alpha: float, lower: float, upper: float) -> float:
  """exp(alpha log upper + (1 - alpha) log lower): u-muP's interpolation between an operation's
  scale in its two limits (Blake et al. 2024, appendix on unit-scaled operations)."""
  return math.exp(alpha * math.log(upper) + (1 - alpha) * math.log(lower))


def attention_output_multiplier(cfg) -> float:
  """u-muP: the attention's output (before its projection) divided by its empirical scale at
  attention multiplier 1: interpolated between its scale under uniform attention, sqrt(log S /
  S) when causal (a row averages up to S positions) and sqrt(1 / S) when not (every row
  averages all S), and 1 (one position), with alpha = 1 / (1 + 4 d_head); times
  sqrt(1 - dropout) (unit_scaling.functional.scaled_dot_product_attention's rule, its is_causal
  choosing the lower end). 1 for the others."""
  if not _of(cfg).unit_scaled:
    return 1.0
  head_dim = cfg.d_model // cfg.num_heads
  length = cfg.max_len
  uniform = math.sqrt((math.log(length) if cfg.causal else 1.0) / length)
  scale = _log_interpolation(1.0 / (1.0 + 4.0 * head_dim), uniform, 1.0)
  return math.sqrt(1.0 - cfg.dropout) / scale


# A standard normal through ReLU has standard deviation sqrt((1 - 1/pi) / 2).
_RELU_UNIT = math.sqrt(2.0 / (1.0 - 1.0 / math.pi))


def activation_multiplier(cfg) -> float:
  """u-muP: the MLP activation's output times its unit scale (GELU at multiplier 1: interpolated
  between 2 and ReLU's sqrt(2 / (1 - 1/pi)) with alpha = 1 / (1 + 1/4); ReLU: the latter).
  1 for the others."""
  if not _of(cfg).unit_scaled:
    return 1.0
  if cfg.activation == "relu":
    return _RELU_UNIT
  return _log_interpolation(1.0 / (1.0 + 0.25), 2.0, _RELU_UNIT)


def branches_per_layer(cfg) -> int:
  return 1 if cfg.attention == "none" else 2


def residual_scales(cfg, branch):
  """(branch multiplier, skip multiplier) of residual branch `branch` (0-based over the stack's
  branches, attention then MLP in each layer; an int, or a traced integer under nn.scan):
  x <- skip x + branch F(x).

  completep: (1 / m_L, 1). umup (Blake et al. 2024, Pre-LN's tau rule with every residual
  multiplier 1): the branch's variance 1/L against the stream's 1 + i/L so far, tau = 1 / (L + i),
  branch sqrt(tau / (1 + tau)) and skip sqrt(1 / (1 + tau)), L the number of layers (u-muP's depth
  scale L^-1/2 on each branch). None for the others (no operation)."""
  if _of(cfg).depth_rules:
    return 1.0 / depth_mult(cfg), 1.0
  if _of(cfg).unit_scaled:
    tau = 1.0 / (cfg.num_layers + branch)
    return (tau / (1.0 + tau)) ** 0.5, (1.0 / (1.0 + tau)) ** 0.5
  return None


def scales_loss_backward(cfg) -> bool:
  """Whether the parametrization scales the loss's gradient in the backward pass (u-muP)."""
  return _of(cfg).unit_scaled


def loss_backward_scale(cfg, count):
  """u-muP: the factor the loss's gradient is multiplied by in the backward pass (and divided by
  in float32 after it): unit scaling's cross entropy, V / sqrt(V - 1) per predicted token, times
  the `count` tokens the mean divides by. None for the others."""
  if not scales_loss_backward(cfg):
    return None
  v = cfg.vocab_size
  return count * (v / math.sqrt(v - 1))
