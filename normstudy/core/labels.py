"""Legend labels, derived from what a run is, so a label cannot disagree with its config.

`config.label` is a template: "" or "{auto}" is `describe(config)` (the placement's name, each
technique that is on, the clip), and "{auto} | Run 2" adds to it; `{optimizer.clip_norm}` style
fields are filled in from the config. A fixed text without braces is taken as it is.
"""

import re

from normstudy import errors
from normstudy.core import placements
from normstudy.core import technique_table
from normstudy.core.fields import get_field
from normstudy.records.names import number


def describe(config) -> str:
  """'Pre-Norm | Attention Relax | Gradient Clip=1': the placement's name, the fragments of what
  is on (normstudy.core.technique_table.legend: a replaced norm, each technique in the table's
  order, the optimizer's), the clip."""
  parts = [placements.get(config.model.placement).label, *technique_table.legend(config)]
  clip = config.optimizer.clip_norm
  parts.append(f"Gradient Clip={number(float(clip))}" if clip else "No Clip")
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
    value = get_field(config, name)
    return format(value, spec) if spec else number(value)

  return _FIELD.sub(fill, template)


MAX_LABEL = 200  # characters of a label template; {auto}'s longest is about 100


def check(config) -> None:
  """ConfigError unless every {field[:format]} of `config.label` names a config field and its
  format applies to the field's value (checked with the config, before anything is written)."""
  template = config.label or "{auto}"
  allowed = ("allowed: {auto} or {section.field} / {section.field:format} of the config, e.g. "
             "{optimizer.learning_rate:g}")
  if len(template) > MAX_LABEL:  # a legend entry that long covers the curves it names
    raise errors.ConfigError(f"config.label is {len(template)} characters long "
                             f"({template[:40]!r}...); allowed: at most {MAX_LABEL} (a legend "
                             "entry)")
  if "\n" in template or "\r" in template:  # a legend entry, a CSV cell: one line each
    raise errors.ConfigError(f"config.label={template!r} holds a line break; allowed: one line")
  if any(ord(c) < 32 or ord(c) == 127 for c in template):  # a tab: a legend's odd gap
    raise errors.ConfigError(f"config.label={template!r} holds a control character; allowed: "
                             "one line of printable characters")
  stray = re.search(r"[{}]", _FIELD.sub("", template))
  if stray:  # {}, {0}, {auto, {x!z}: no field, or a format this template language lacks
    raise errors.ConfigError(f"config.label={template!r}: a {stray.group(0)!r} that is not part "
                             f"of a {{field}}; {allowed}")
  for match in _FIELD.finditer(template):
    name, spec = match.group(1), match.group(2)
    if name == "auto":
      continue
    try:
      value = get_field(config, name)
    except (KeyError, AttributeError):
      raise errors.ConfigError(
          f"config.label={template!r}: {{{name}}} is not a config field; {allowed}") from None
    if hasattr(value, "keys"):  # a section: its YAML is no label
      raise errors.ConfigError(
          f"config.label={template!r}: {{{name}}} is a section, not a field; {allowed}")
    if spec:
      try:
        format(value, spec)
      except (ValueError, TypeError):
        raise errors.ConfigError(
            f"config.label={template!r}: the format {spec!r} does not apply to "
            f"config.{name}={value!r}; allowed: a Python format spec for its type, e.g. "
            "{optimizer.learning_rate:g}") from None
