"""Legend labels, derived from what a run is, so a label cannot disagree with its config.

`config.label` is a template: "" or "{auto}" is `describe(config)` (the placement's name, each
technique that is on, the clip), and "{auto} | Run 2" adds to it; `{optimizer.clip_norm}` style
fields are filled in from the config. A fixed text without braces is taken as it is.
"""

import re

from normstudy import config as config_lib
from normstudy import placements


def _number(value) -> str:
  return f"{value:g}" if isinstance(value, float) else str(value)


def describe(config) -> str:
  """'Pre-Norm | Attention Relax | Gradient Clip=1', from the fields that set the design."""
  model, opt = config.model, config.optimizer
  parts = [placements.get(model.placement).label]
  if model.attention_relax > 0:
    parts.append("Attention Relax" + (" (after product)"
                                      if model.attention_relax_form == "after_product" else ""))
  parts += [text for on, text in (
      (model.qk_norm != "none", "QK-Norm" + (" (RMS)" if model.qk_norm == "rmsnorm" else "")),
      (model.layer_scale > 0, f"LayerScale={_number(float(model.layer_scale))}"),
      (model.emb_grad_shrink < 1, f"Emb Grad Shrink={_number(float(model.emb_grad_shrink))}"),
      (model.attn_softcap > 0, f"Attn Softcap={_number(float(model.attn_softcap))}"),
      (model.output_softcap > 0, f"Output Softcap={_number(float(model.output_softcap))}"),
      (model.attention_scores_dtype == "float32", "fp32 Scores"),
      (config.loss.z_loss > 0, f"z-loss={_number(float(config.loss.z_loss))}"),
  ) if on]
  parts.append(f"Gradient Clip={_number(float(opt.clip_norm))}" if opt.clip_norm
               else "No Clip")
  return " | ".join(parts)


_FIELD = re.compile(r"\{([a-z_][a-z0-9_.]*)(?::([^}]*))?\}")


def resolve(config) -> str:
  """The label of a run: `config.label` with {auto} and {field[:format]} filled in."""
  template = config.label or "{auto}"

  def fill(match):
    name, spec = match.group(1), match.group(2)
    if name == "auto":
      return describe(config)
    value = config_lib.get_field(config, name)
    return format(value, spec) if spec else _number(value)

  return _FIELD.sub(fill, template)
