"""Legend labels, derived from what a run is, so a label cannot disagree with its config.

`config.label` is a template: "" or "{auto}" is `describe(config)` (the placement's name, each
technique that is on, the clip), and "{auto} | Run 2" adds to it; `{optimizer.clip_norm}` style
fields are filled in from the config. A fixed text without braces is taken as it is.
"""

import re

from normstudy import config as config_lib
from normstudy import placements
from normstudy import techniques


def _number(value) -> str:
  return f"{value:g}" if isinstance(value, float) else str(value)


def describe(config) -> str:
  """'Pre-Norm | Attention Relax | Gradient Clip=1': the placement's name, each technique that is
  on (normstudy.techniques, in its table's order), the clip."""
  parts = [placements.get(config.model.placement).label, *techniques.legend(config)]
  clip = config.optimizer.clip_norm
  parts.append(f"Gradient Clip={_number(float(clip))}" if clip else "No Clip")
  return " | ".join(parts)


_FIELD = re.compile(r"\{([a-z_][a-z0-9_.]*)(?::([^}]*))?\}")


def resolve(config, template: str | None = None) -> str:
  """The label of a run: `config.label` (or `template`) with {auto} and {field[:format]}
  filled in."""
  template = template or config.label or "{auto}"

  def fill(match):
    name, spec = match.group(1), match.group(2)
    if name == "auto":
      return describe(config)
    value = config_lib.get_field(config, name)
    return format(value, spec) if spec else _number(value)

  return _FIELD.sub(fill, template)
