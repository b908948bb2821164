"""How a config field is declared and read.

A `Field` is one field of the schema (normstudy.core.config.FIELDS): its dotted name, default,
what values it allows and its one-line description. The schema's ConfigDict, its range checks
and the configuration table of docs/reference.md all come from these declarations.
"""

import dataclasses
from typing import Any, Callable

_NO_VALUE = object()


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field.

  name      dotted: "model.num_layers"
  default   its value unless a config file or the command line sets another (its type is the
            field's: ConfigDict refuses a value of another type)
  doc       one line: what it is
  allowed   a tuple of the values it may take, or a description of them ("an integer >= 1");
            None: any value of its type
  accepts   for a described `allowed`: the test a value must pass (None: not checked here, e.g. a
            registered name, which normstudy.experiments.validation checks)
  kind      the type of a field whose default is None (a placeholder)
  before    what a run saved before the field existed behaved as, where that is not the default
            (normstudy.core.per_run.config_differences)
  """
  name: str
  default: Any
  doc: str
  allowed: Any = None
  accepts: Callable[[Any], bool] | None = None
  kind: type | None = None
  before: Any = _NO_VALUE

  @property
  def section(self) -> str:
    return self.name.rpartition(".")[0]

  @property
  def key(self) -> str:
    return self.name.rpartition(".")[2]

  @property
  def choices(self) -> tuple | None:
    return self.allowed if isinstance(self.allowed, tuple) else None

  @property
  def has_before(self) -> bool:
    return self.before is not _NO_VALUE

  def check(self, value) -> bool:
    """Whether `value` is allowed by this declaration (a choice, or passing `accepts`)."""
    if self.choices is not None:
      return value in self.choices
    if self.accepts is None:
      return True
    try:
      return bool(self.accepts(value))
    except TypeError:
      return False

  def allowed_text(self) -> str:
    """What the field allows, in words."""
    if self.choices is not None:
      return ", ".join(str(c) for c in self.choices)
    return self.allowed or ""


def get_field(config, dotted: str):
  """`config.a.b` for "a.b" (a ConfigDict, a dict, or a config.json's object)."""
  for key in dotted.split("."):
    config = config[key]
  return config
