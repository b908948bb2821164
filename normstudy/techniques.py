"""Stability techniques that combine with any placement, as a table (like placements' registry).

Each entry is one config field: its off value (the schema's default, at which the technique adds
no operation), what values are allowed, its legend fragment and the combinations it refuses. The
schema (normstudy.config: defaults and ranges), the legend (normstudy.labels) and validation
(normstudy.validation) all read this table, so adding a technique is its entry here, its code
(the model or the loss) and its numpy reference (tests/numpy_reference.py).

Techniques that are block designs (Sub-LN, Peri-LN, Mix-LN, ReZero) are placements instead
(normstudy.placements).
"""

import dataclasses
from typing import Any, Callable


def _get(config, dotted: str):
  for key in dotted.split("."):
    config = config[key]
  return config


def _number(value) -> str:
  return f"{value:g}" if isinstance(value, float) else str(value)


@dataclasses.dataclass(frozen=True)
class Conflict:
  """A combination refused with one line: `clashes(config)` says whether it is present."""
  clashes: Callable[[Any], bool]
  message: Callable[[Any], str]


@dataclasses.dataclass(frozen=True)
class Technique:
  """`field` (dotted), its `off` value, `allowed` (a tuple of choices, or a description that
  `accepts` tests), `legend(value, config)` (the label fragment when on), `conflicts`, and the
  paper it comes from."""
  field: str
  off: Any
  allowed: Any
  legend: Callable[[Any, Any], str]
  paper: str
  accepts: Callable[[Any], bool] | None = None
  conflicts: tuple = ()

  def value(self, config):
    return _get(config, self.field)

  def is_on(self, config) -> bool:
    return self.value(config) != self.off


def _scale(name):
  return lambda value, config: f"{name}={_number(float(value))}"


def _relax_legend(value, config):
  del value
  return "Attention Relax" + (" (after product)"
                              if config.model.attention_relax_form == "after_product" else "")


TECHNIQUES = (
    Technique("model.attention_relax", 0.0, "0 (off) or a number > 0", _relax_legend,
              "Ding et al. 2021 (CogView, PB-Relax); MERT uses alpha = 32",
              accepts=lambda v: v >= 0),
    Technique("model.qk_norm", "none", ("none", "layernorm", "rmsnorm"),
              lambda v, c: "QK-Norm" + (" (RMS)" if v == "rmsnorm" else ""),
              "Dehghani et al. 2023 (ViT-22B); Wortsman et al. 2023"),
    Technique("model.layer_scale", 0.0, "0 (off) or a number > 0", _scale("LayerScale"),
              "Touvron et al. 2021 (CaiT)", accepts=lambda v: v >= 0,
              conflicts=(Conflict(
                  lambda c: c.model.placement == "rezero",
                  lambda c: f"config.model.layer_scale={c.model.layer_scale:g} scales the "
                            "branches that config.model.placement='rezero' already scales by a "
                            "learned scalar; use one of them"),)),
    Technique("model.emb_grad_shrink", 1.0, "a number in (0, 1]; 1 = off",
              _scale("Emb Grad Shrink"), "Zeng et al. 2022 (GLM-130B)",
              accepts=lambda v: 0 < v <= 1),
    Technique("model.attn_softcap", 0.0, "0 (off) or a number > 0", _scale("Attn Softcap"),
              "Gemma Team 2024 (Gemma 2)", accepts=lambda v: v >= 0,
              conflicts=(Conflict(
                  lambda c: c.model.attention_relax > 0,
                  lambda c: f"config.model.attn_softcap={c.model.attn_softcap:g} caps the "
                            "scores that config.model.attention_relax="
                            f"{c.model.attention_relax:g} shifts by their row maximum; use one "
                            "of them (set the other to 0)"),)),
    Technique("model.output_softcap", 0.0, "0 (off) or a number > 0", _scale("Output Softcap"),
              "Gemma Team 2024 (Gemma 2)", accepts=lambda v: v >= 0),
    Technique("model.attention_scores_dtype", "compute", ("compute", "float32"),
              lambda v, c: "fp32 Scores", "the simplest fix for score overflow"),
    Technique("loss.z_loss", 0.0, "0 (off) or a number > 0", _scale("z-loss"),
              "Chowdhery et al. 2022 (PaLM)", accepts=lambda v: v >= 0),
)


def on(config) -> list:
  """The techniques a config turns on, in the table's (the legend's) order."""
  return [t for t in TECHNIQUES if t.is_on(config)]


def legend(config) -> list[str]:
  """The legend fragments of the techniques that are on."""
  return [t.legend(t.value(config), config) for t in on(config)]


def conflicts(config) -> list[str]:
  """The message of every refused combination present in `config`, in the table's order."""
  return [c.message(config) for t in on(config) for c in t.conflicts if c.clashes(config)]
