"""One declared experiment: what a config file's `EXPERIMENT` names, and what sweep.json records.

  EXPERIMENT = Experiment(
      arms={name: (label, {dotted.field: value})},   # the arms (a file's variants)
      axes={dotted.field: [values]},                 # the sweep's grid (seeds among them)
      settings={dotted.field: value},                # every run of the sweep gets them
      search=Search("optimizer.learning_rate", 0.1, 1.0, rounds=4, probe_decades=0.125),
      parts={"learning": Part(axes={...})},          # further sweeps into DIR/<part>
      report="critical learning rate by search")     # what the analysis writes

`python -m normstudy.sweep --config=FILE --workdir=DIR` runs the whole of it: the grid or the
search, then each part into DIR/<part>, then the analysis of DIR (against a sibling directory
when `against` names one); the make targets pass nothing else. sweep.json keeps it whole
(`as_json`), so a workdir says what made it and the analysis reads which report to write from
it (normstudy.analysis.analyze); directories written before it was recorded are analysed as
they were. A file may declare EXPERIMENT or the older module tables (VARIANTS, SWEEP_VARIANTS,
STUDY_VARIANTS, SWEEP, SWEEP_SETTINGS), never both (normstudy.experiments.grid reads either).
"""

import dataclasses
from typing import Any

# The module ml_collections' config_flags (1.1) loads a command's --config file as: the command
# reads the file's EXPERIMENT from it (normstudy.experiments.grid), and normstudy.cli drops it
# before each parse (its loader re-executes a file into a module already there, keeping the
# globals an earlier command's file defined).
CONFIG_MODULE = "config_config"
# The analysis's reports an experiment may name (normstudy.analysis.REPORTS; a test checks they
# agree): "" lets the analysis choose from the runs.
REPORTS = ("critical learning rate by search", "learning-rate sweep", "depth", "learning speed")


@dataclasses.dataclass(frozen=True)
class Search:
  """The critical value of `field` by bisection per point of the other axes (normstudy.
  experiments.search): from [low, high], `rounds` rounds, then a probe round `probe_decades`
  either side of each midpoint (0: none)."""
  field: str
  low: float
  high: float
  rounds: int
  probe_decades: float = 0.0

  @property
  def flag(self) -> str:
    """The --search flag's text of it."""
    return f"{self.field}:{self.low!r},{self.high!r}"


@dataclasses.dataclass(frozen=True)
class Part:
  """A further sweep of the same arms into DIR/<name>, after the main one (if the experiment
  has one): its own axes (replacing the experiment's), settings (added to the experiment's),
  search and limit of runs per program."""
  axes: dict = dataclasses.field(default_factory=dict)
  settings: dict = dataclasses.field(default_factory=dict)
  search: Search | None = None
  max_runs_per_program: int = 0


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A config file's one declaration of what it runs (the module docstring)."""
  arms: dict = dataclasses.field(default_factory=dict)
  sweep_arms: tuple = ()  # the arms a sweep trains; () = all of them, in `arms`' order
  study_arms: tuple = ()  # the arms normstudy.study trains; () = all
  axes: dict = dataclasses.field(default_factory=dict)
  settings: dict = dataclasses.field(default_factory=dict)
  search: Search | None = None
  max_runs_per_program: int = 0  # 0: no limit
  parts: dict = dataclasses.field(default_factory=dict)  # {name: Part}
  against: str = ""  # a sibling workdir whose search the analysis compares with (interaction)
  report: str = ""  # the analysis's report (normstudy.analysis.REPORTS' name); "": by the data
  seeds: tuple = ()  # normstudy.study's seeds; (): the config's own

  @property
  def has_main(self) -> bool:
    """Whether it sweeps DIR itself (axes or a search), not only its parts."""
    return bool(self.axes) or self.search is not None

  def tables(self) -> dict:
    """The module tables this declaration stands for (normstudy.experiments.grid's names)."""
    tables = {"VARIANTS": dict(self.arms), "SWEEP": dict(self.axes),
              "SWEEP_SETTINGS": dict(self.settings)}
    if self.sweep_arms:
      tables["SWEEP_VARIANTS"] = tuple(self.sweep_arms)
    if self.study_arms:
      tables["STUDY_VARIANTS"] = tuple(self.study_arms)
    return {name: value for name, value in tables.items() if value}

  def as_json(self) -> dict:
    """What sweep.json records: every field, JSON's types."""
    return _plain(dataclasses.asdict(self))


def _plain(value: Any) -> Any:
  if isinstance(value, dict):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value
