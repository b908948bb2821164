"""One declared experiment: what a config file exports, and what sweep.json records.

  EXPERIMENT = Experiment(
      base=base_config,                              # the config every arm starts from
      arms={name: (label, {dotted.field: value})},   # the arms (the file's variants)
      axes={dotted.field: [values]},                 # the sweep's grid (seeds among them)
      settings={dotted.field: value},                # every run of the sweep gets them
      search=Search("optimizer.learning_rate", 0.1, 1.0, rounds=4, probe_decades=0.125),
      parts={"learning": Part(axes={...})},          # further sweeps into DIR/<part>
      report="critical learning rate by search")     # what the analysis writes
  get_config = EXPERIMENT.get_config                 # what ml_collections' --config calls

The kinds that are more than a grid say so in one more field: `ladder=Ladder(...)` (a grid at
each model size, normstudy.ladder), `drift=Drift(...)` (a grid and a held-out stage,
normstudy.drift), `techniques=Techniques(...)` (a grid read against its baselines,
normstudy.techniques). `kind` names which; `python -m normstudy.run --config=FILE
--workdir=DIR` runs any of them by it (then the commands `then` lists), and the make targets
are that one command.

A config file exports its EXPERIMENT (and the get_config derived from it) and nothing else is
read from it. sweep.json keeps the experiment whole (`as_json`), so a workdir says what made it
and the analysis reads which report to write from it (normstudy.analysis.analyze).
"""

import dataclasses
import os
from typing import Any, Callable

from normstudy.core import config as config_lib

# The module ml_collections' config_flags (1.1) loads a command's --config file as: the command
# reads the file's EXPERIMENT from it (normstudy.experiments.grid), and normstudy.cli drops it
# before each parse (its loader re-executes a file into a module already there, keeping the
# globals an earlier command's file defined).
CONFIG_MODULE = "config_config"
# The analysis's reports an experiment may name (normstudy.analysis.REPORTS; a test checks they
# agree): "" lets the analysis choose from the runs.
REPORTS = ("critical learning rate by search", "learning-rate sweep", "depth", "learning speed")
KINDS = ("grid", "ladder", "drift", "techniques")


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
class Transfer:
  """What ladder_parametrization.csv compares: each arm's slope beside its sp arm's (`arms`:
  {arm: sp arm}), from the sp ladder's ladder.csv (`reference`) where a part has no sp rung."""
  reference: str
  arms: dict


@dataclasses.dataclass(frozen=True)
class Ladder:
  """A size ladder (normstudy.ladder): at each rung (num_layers, d_model) of `rungs`, in each
  of `dtypes`, the experiment's arms swept with `rung_overrides(num_layers, d_model)` ({dotted
  field: value}) and one measure: `search` (the critical learning rate) or a grid over
  `learning_rates`. `heldout` rungs train after the prediction from the others
  (`rung_steps(num_layers, d_model)`: their horizon). Or a ladder of ladders: `parts` {name:
  ladder config file}, each trained into DIR/<name>/, compared by `transfer`."""
  rungs: tuple = ()
  dtypes: tuple = ()
  rung_overrides: Callable | None = None
  search: Search | None = None
  learning_rates: tuple = ()
  heldout: tuple = ()
  rung_steps: Callable | None = None
  parts: dict = dataclasses.field(default_factory=dict)
  transfer: Transfer | None = None


@dataclasses.dataclass(frozen=True)
class Heldout:
  """A drift's held-out stage: `arms` trained for `steps` at `seeds`, at the rates where the
  fitted law predicts each of `fractions` of runs failing, predicted before they train."""
  arms: tuple
  steps: int
  seeds: tuple
  fractions: tuple


@dataclasses.dataclass(frozen=True)
class Drift:
  """Failure as a drift (normstudy.drift): the experiment's grid fitted by the survival law
  over `law_arms` (`num_steps` a run), `decay_base` also at `weight_decays` ({arm: weight
  decay}, arms of the experiment), then the `heldout` stage."""
  law_arms: tuple
  decay_base: str
  weight_decays: dict
  num_steps: int
  heldout: Heldout


@dataclasses.dataclass(frozen=True)
class Techniques:
  """Techniques against their baselines (normstudy.techniques): `baselines` {arm: its baseline
  arm}; `spike_handling` the arms that handle spikes (skip-step, update clipping), compared by
  the `measures` of normstudy.analysis.techniques_report.MEASURE_SETS."""
  baselines: dict
  spike_handling: tuple = ()
  measures: str = "recovery"


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A config file's one declaration of what it runs (the module docstring)."""
  base: Callable | None = None  # () -> the config every arm starts from
  arms: dict = dataclasses.field(default_factory=dict)
  default_arm: str = ""  # get_config()'s arm; "": the first
  arm_kind: str = "variant"  # what an arm is called in messages (configs/lm.py: "size")
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
  ladder: Ladder | None = None
  drift: Drift | None = None
  techniques: Techniques | None = None
  # Commands run after its kind's (normstudy.run): "normstudy.MODULE --flag=...", with
  # "{workdir}" for the experiment's directory.
  then: tuple = ()

  @property
  def kind(self) -> str:
    """Which command runs it (KINDS): a ladder, a drift, techniques against baselines, or a
    grid (normstudy.sweep, or normstudy.study for arms alone)."""
    return ("ladder" if self.ladder else "drift" if self.drift else
            "techniques" if self.techniques else "grid")

  @property
  def has_main(self) -> bool:
    """Whether it sweeps DIR itself (axes or a search), not only its parts."""
    return bool(self.axes) or self.search is not None

  def get_config(self, variant: str | None = None):
    """The config of arm `variant` (default: `default_arm`): `base()`, then the arm's label (a
    template, normstudy.core.labels) and settings, applied as the command line applies
    overrides. ValueError for a name `arms` lacks, naming the ones it has."""
    if self.base is None:
      raise ValueError("this experiment declares no base config (Experiment(base=...))")
    if not self.arms:
      return self.base()
    variant = variant or self.default_arm or next(iter(self.arms))
    return config_lib.variant_config(self.arms, self.base, variant, kind=self.arm_kind)

  def as_json(self) -> dict:
    """What sweep.json records: every declared field, JSON's types (a function by its name)."""
    return _plain({field.name: getattr(self, field.name)
                   for field in dataclasses.fields(self)})


def _plain(value: Any) -> Any:
  if dataclasses.is_dataclass(value):
    return _plain({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
  if isinstance(value, dict):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if callable(value):  # a function by its file and name (a builtin or partial by its name)
    code = getattr(value, "__code__", None)
    where = f"{os.path.basename(code.co_filename)}:" if code is not None else ""
    return where + getattr(value, "__qualname__", type(value).__name__)
  return value
