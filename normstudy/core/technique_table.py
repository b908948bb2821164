"""Stability techniques that combine with any placement, as a table (like placements' registry).

Each entry declares one config field (a normstudy.core.fields.Field: its off value, the schema's
default at which the technique adds no operation, what values are allowed, a line about it), its
legend fragment, its paper and the combinations it refuses. The schema (normstudy.core.config),
the legend (normstudy.core.labels) and validation (normstudy.experiments.validation) all read
this table, so adding a technique is its entry here, its code (the model or the loss) and its
numpy reference (tests/numpy_reference.py).

Techniques that are block designs (Sub-LN, Peri-LN, Mix-LN, ReZero) are placements instead
(normstudy.core.placements).
"""

import dataclasses
from typing import Any, Callable

from normstudy.core import parametrizations
from normstudy.core import placements
from normstudy.core.fields import Field
from normstudy.core.fields import get_field
from normstudy.records.names import number


@dataclasses.dataclass(frozen=True)
class Conflict:
  """A combination refused with one line: `clashes(config)` says whether it is present."""
  clashes: Callable[[Any], bool]
  message: Callable[[Any], str]


@dataclasses.dataclass(frozen=True)
class Technique:
  """A technique's config field (`declaration`: its off value is the default), its legend
  fragment when on (`legend(value, config)`), the paper it comes from and the combinations it
  refuses."""
  declaration: Field
  legend: Callable[[Any, Any], str]
  paper: str
  conflicts: tuple = ()

  @property
  def field(self) -> str:
    return self.declaration.name

  @property
  def off(self):
    return self.declaration.default

  def value(self, config):
    return get_field(config, self.field)

  def is_on(self, config) -> bool:
    return self.value(config) != self.off


def _scale(name):
  return lambda value, config: f"{name}={number(float(value))}"


def _relax_legend(value, config):
  del value
  return "Attention Relax" + (" (after product)"
                              if config.model.attention_relax_form == "after_product" else "")


def _needs_attention(field: str, what: str) -> Conflict:
  """Refuses a technique that acts on attention when the model has none (model.attention=none:
  it would train silently without it)."""
  return Conflict(lambda c: c.model.attention == "none",
                  lambda c: f"config.{field}={get_field(c, field)!r} {what}; "
                            "config.model.attention='none' has no attention: turn one off")


def _placement(config) -> placements.Placement:
  return placements.get(config.model.placement)


def _parametrization_conflicts():
  depth = lambda: [n for n, p in placements.REGISTRY.items() if p.depth_parametrizable]  # noqa: E731
  return (
      Conflict(lambda c: _placement(c).unit_sphere,
               lambda c: f"config.model.parametrization={c.model.parametrization!r} scales "
                         f"matrices that config.model.placement={c.model.placement!r} keeps on "
                         f"the unit sphere; allowed with {c.model.placement}: 'sp'"),
      Conflict(lambda c: parametrizations.get(c.model.parametrization).pre_ln_only
               and not _placement(c).depth_parametrizable,
               lambda c: f"config.model.parametrization={c.model.parametrization!r} scales "
                         "residual branches as derived for Pre-LN; config.model.placement="
                         f"{c.model.placement!r} is not; allowed: "
                         f"{', '.join(repr(n) for n in depth())}, or parametrization "
                         + " or ".join(repr(n) for n in parametrizations.NAMES
                                       if not parametrizations.get(n).pre_ln_only)),
      Conflict(lambda c: parametrizations.get(c.model.parametrization).untied_head
               and c.model.tie_embeddings,
               lambda c: f"config.model.parametrization={c.model.parametrization!r} scales the "
                         "embedding and the readout differently; config.model.tie_embeddings="
                         "True shares them; allowed: tie_embeddings=False"),
  )


TECHNIQUES = (
    Technique(Field("model.parametrization", "sp", "how init, multipliers and per-parameter "
                    "learning rates scale with width and depth (normstudy.core."
                    "parametrizations): sp (standard), mup (Yang et al. 2022), completep (Dey "
                    "et al. 2025), umup (Blake et al. 2024)", parametrizations.NAMES),
              lambda v, c: parametrizations.get(v).label,
              "Yang et al. 2022 (muP); Dey et al. 2025 (CompleteP); Blake et al. 2024 (u-muP)",
              conflicts=_parametrization_conflicts()),
    Technique(Field("model.attention_relax", 0.0,
                    "attention relax alpha (PB-Relax; MERT: 32), in the form "
                    "model.attention_relax_form", "0 (off) or a number > 0",
                    accepts=lambda v: v >= 0),
              _relax_legend, "Ding et al. 2021 (CogView, PB-Relax); MERT uses alpha = 32",
              conflicts=(_needs_attention("model.attention_relax", "relaxes attention scores"),)),
    Technique(Field("model.qk_norm", "none", "QK-norm: queries and keys normalised per head, no "
                    "bias", ("none", "layernorm", "rmsnorm")),
              lambda v, c: "QK-Norm" + (" (RMS)" if v == "rmsnorm" else ""),
              "Dehghani et al. 2023 (ViT-22B); Wortsman et al. 2023",
              conflicts=(_needs_attention("model.qk_norm", "normalises queries and keys"),
                         Conflict(lambda c: _placement(c).qkv_norm,
                                  lambda c: f"config.model.qk_norm={c.model.qk_norm!r} "
                                            "normalises queries and keys, which config.model."
                                            f"placement={c.model.placement!r} already "
                                            "normalises (with the values); allowed: 'none'"))),
    Technique(Field("model.layer_scale", 0.0, "LayerScale: each branch times a learned "
                    "per-channel gain initialised to this", "0 (off) or a number > 0",
                    accepts=lambda v: v >= 0),
              _scale("LayerScale"), "Touvron et al. 2021 (CaiT)",
              conflicts=(Conflict(
                  lambda c: _placement(c).branch_scale is not None,
                  lambda c: f"config.model.layer_scale={c.model.layer_scale:g} scales the "
                            f"branches that config.model.placement={c.model.placement!r} "
                            f"already scales by a learned {_placement(c).branch_scale}; use "
                            "one of them"),)),
    Technique(Field("model.emb_grad_shrink", 1.0, "embedding gradient shrink: the embedding's "
                    "gradient times this, its value unchanged", "a number in (0, 1]; 1 = off",
                    accepts=lambda v: 0 < v <= 1),
              _scale("Emb Grad Shrink"), "Zeng et al. 2022 (GLM-130B)"),
    Technique(Field("model.attn_softcap", 0.0, "attention scores soft-capped: cap * tanh(s / cap)",
                    "0 (off) or a number > 0", accepts=lambda v: v >= 0),
              _scale("Attn Softcap"), "Gemma Team 2024 (Gemma 2)",
              conflicts=(Conflict(
                  lambda c: c.model.attention_relax > 0,
                  lambda c: f"config.model.attn_softcap={c.model.attn_softcap:g} caps the "
                            "scores that config.model.attention_relax="
                            f"{c.model.attention_relax:g} shifts by their row maximum; use one "
                            "of them (set the other to 0)"),
                         _needs_attention("model.attn_softcap", "caps attention scores"))),
    Technique(Field("model.output_softcap", 0.0, "output logits soft-capped: cap * tanh(s / cap)",
                    "0 (off) or a number > 0", accepts=lambda v: v >= 0),
              _scale("Output Softcap"), "Gemma Team 2024 (Gemma 2)"),
    Technique(Field("model.attention_scores_dtype", "compute", "the dtype of q, k and their "
                    "product: the compute dtype, or float32 (no fp16 overflow)",
                    ("compute", "float32")),
              lambda v, c: "fp32 Scores", "the simplest fix for score overflow",
              conflicts=(_needs_attention("model.attention_scores_dtype",
                                          "sets the dtype of attention scores"),)),
    Technique(Field("model.layernorm_scaling", False, "LayerNorm Scaling: each norm's output "
                    "in layer l (1-based) times 1/sqrt(l)", "True or False"),
              lambda v, c: "LN Scaling", "Sun et al. 2025 (\"The Curse of Depth in Large "
              "Language Models\"); OLMo-core's default_scaled block",
              conflicts=(Conflict(
                  lambda c: not _placement(c).has_norms,
                  lambda c: "config.model.layernorm_scaling=True scales the norms' outputs; "
                            f"config.model.placement={c.model.placement!r} has no norms"),)),
    Technique(Field("model.qk_clip", 0.0, "QK-clip: after each update, each head's W_q and W_k "
                    "(and their biases) times sqrt(min(1, tau / S_max)), S_max the head's "
                    "largest logit in the step (Kimi K2: tau = 100)", "0 (off) or a number > 0",
                    accepts=lambda v: v >= 0),
              _scale("QK-Clip"), "Kimi Team 2025 (Kimi K2, MuonClip); MaxText, Megatron-LM",
              conflicts=(Conflict(
                  lambda c: c.model.qk_norm != "none",
                  lambda c: f"config.model.qk_clip={c.model.qk_clip:g} rescales W_q and W_k, "
                            f"which config.model.qk_norm={c.model.qk_norm!r} normalises away; "
                            "use one of them"),
                         Conflict(
                  lambda c: c.model.attention == "none",
                  lambda c: f"config.model.qk_clip={c.model.qk_clip:g} clips attention logits; "
                            "config.model.attention='none' has none"),
                         Conflict(
                  lambda c: _placement(c).unit_sphere,
                  lambda c: f"config.model.qk_clip={c.model.qk_clip:g} rescales W_q and W_k, "
                            f"which config.model.placement={c.model.placement!r} puts back on "
                            "the unit sphere after every update; use one of them"))),
    Technique(Field("loss.z_loss", 0.0, "z-loss: this times the mean (log Z)^2 added to the loss",
                    "0 (off) or a number > 0", accepts=lambda v: v >= 0),
              _scale("z-loss"), "Chowdhery et al. 2022 (PaLM)"),
)


@dataclasses.dataclass(frozen=True)
class Legend:
  """The legend fragment of a field declared elsewhere (normstudy.core.config) that names a
  technique by some of its values: `text(value)` is the fragment, or None for none."""
  field: str
  text: Callable[[Any], str | None]
  paper: str


# Before the techniques: what replaces every norm. After them: the optimizer's techniques.
LEGENDS_BEFORE = (
    Legend("model.norm", lambda v: "DyT" if v == "dyt" else None, "Zhu et al. 2025 (DyT)"),
)
LEGENDS_AFTER = (
    Legend("optimizer.name", lambda v: "Adam-atan2" if v == "adam_atan2" else None,
           "Everett et al. 2024 (Adam-atan2)"),
    Legend("optimizer.update_clip",
           lambda v: f"Update Clip={number(float(v))}" if v else None, "update clipping"),
    Legend("optimizer.skip_spikes",
           lambda v: f"Skip-Step={number(float(v))} sd" if v else None,
           "OLMo-core's skip-step"),
)


def on(config) -> list:
  """The techniques a config turns on, in the table's (the legend's) order."""
  return [t for t in TECHNIQUES if t.is_on(config)]


def legend(config) -> list[str]:
  """The legend fragments of what is on: a replaced norm, the techniques in the table's order,
  the optimizer's techniques."""
  def fragments(rows):
    return [text for text in (row.text(get_field(config, row.field)) for row in rows) if text]
  return (fragments(LEGENDS_BEFORE) + [t.legend(t.value(config), config) for t in on(config)]
          + fragments(LEGENDS_AFTER))


def conflicts(config) -> list[str]:
  """The message of every refused combination present in `config`, in the table's order."""
  return [c.message(config) for t in on(config) for c in t.conflicts if c.clashes(config)]
