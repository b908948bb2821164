"""What a run, a study and a sweep write, defined once: the files' names, a run's statuses and
what counts as a failed run, where a run first went non-finite, and the typed records of
run.json (`RunInfo`), study.json (`StudyRecord`) and sweep.json (`SweepRecord`, with a search's
`SearchRecord`).

The engine writes these records and the analysis reads them through the same definitions; the
search runner judges its runs by the same failure rule the analysis reports
(normstudy.records.outcomes). Plain
Python: nothing here needs the training stack. A file written by an older normstudy lacks some
keys: they read as None (or empty), and keys this version does not know are kept as they were.

  <run>/config.json            the resolved config
  <run>/run.json               RunInfo: what the run is, and its life
  <run>/metrics.jsonl          one record per logged step (normstudy.records.metrics; the keys:
                               normstudy.records.keys)
  <run>/checkpoints/<step>/    orbax: the train state (a single run's; a study's or sweep's
                               programs keep theirs under <dir>/checkpoints/<program>/)
  <study>/study.json           StudyRecord: a study's variants in legend order
  <sweep>/sweep.json           SweepRecord: a sweep's axes and its runs with their status
  <run or sweep>/normstudy.log what the libraries said while it trained (their records at
                               WARNING and below, XLA's and tensorstore's native stderr): kept
                               off the terminal (normstudy.engine.logs), appended per process
  <study or sweep>/<figure>.png and beside it <figure>.svg, or the copies figure_formats() names
"""

import dataclasses
import enum
import os
from typing import Any

from normstudy import errors

# The copies an analysis saves beside each figure's PNG: comma-separated, any of
# VECTOR_FORMATS, empty for the PNG alone (each copy renders the figure again: about half of a
# small sweep's analysis).
FIGURE_FORMATS_ENV = "NORMSTUDY_FIGURE_FORMATS"
VECTOR_FORMATS = ("svg", "pdf")
DEFAULT_FIGURE_FORMATS = ("svg",)


def figure_formats() -> tuple:
  """The vector formats $NORMSTUDY_FIGURE_FORMATS asks for (DEFAULT_FIGURE_FORMATS when unset);
  UserError naming the value and what is allowed otherwise (every command checks it first:
  normstudy.cli.run)."""
  value = os.environ.get(FIGURE_FORMATS_ENV)
  if value is None:
    return DEFAULT_FIGURE_FORMATS
  formats = tuple(f.strip().lower() for f in value.split(",") if f.strip())
  if any(f not in VECTOR_FORMATS for f in formats) or len(set(formats)) != len(formats):
    raise errors.UserError(
        f"{FIGURE_FORMATS_ENV}={value!r} is not allowed; allowed: formats saved beside each "
        f"PNG, comma-separated, each once, from {', '.join(VECTOR_FORMATS)}; empty for PNG only")
  return formats


CONFIG = "config.json"
RUN = "run.json"
METRICS = "metrics.jsonl"
# A run started over with no checkpoint to continue from (its checkpoints deleted, or killed
# before the first was complete) keeps the records it had here, beside the new ones.
METRICS_BEFORE_RESTART = "metrics.before_restart.jsonl"
CHECKPOINTS = "checkpoints"
# Each checkpoint step's one item, the train state: <checkpoints>/<step>/state
# (normstudy.engine.checkpoints writes and reads it).
CHECKPOINT_ITEM = "state"
DAMAGED_CHECKPOINTS = "checkpoints_damaged"
STUDY = "study.json"
SWEPT = "sweep.json"  # what a sweep, or a study over seeds, ran (SweepRecord)
LOCK = ".normstudy.lock"
LIBRARY_LOG = "normstudy.log"
# launch/tpu_pod.sh's copy of each worker's run.log (worker-N.log), kept in the run's gs://
# workdir as the run goes so `tpu_pod.sh --logs` reads it from anywhere.
LAUNCH_LOGS = "launch_logs"
EVENTS_PREFIX = "events.out.tfevents."  # TensorBoard's event files, beside metrics.jsonl
# A size ladder's rungs (normstudy.experiments.ladder_runs writes it, normstudy.analysis.ladder_report fits
# it): per rung and arm the model's size and the critical learning rate with its interval.
LADDER = "ladder.csv"
LADDER_COLUMNS = ("arm", "dtype", "num_layers", "d_model", "params", "critical_lr",
                  "critical_lr_low", "critical_lr_high")
# A ladder's learning-rate sensitivity (normstudy.analysis.ladder_sensitivity writes it from
# each rung's grid): per rung and arm Wortsman et al.'s LR sensitivity, the mean over seeds with
# its 95% t interval, and the best learning rate and loss of the seeds' mean curve.
# How often each arm's gradient clip acted at each rung (normstudy.analysis.ladder_report's
# clip_table): the share of logged steps whose gradient norm exceeded the clip norm, over every
# probe of the rung's search and over the probes that did not fail.
LADDER_CLIP = "ladder_clip.csv"
LADDER_CLIP_COLUMNS = ("arm", "dtype", "num_layers", "d_model", "clip_norm", "runs",
                       "clipped_fraction", "alive", "clipped_fraction_alive")
LADDER_SENSITIVITY = "ladder_sensitivity.csv"
LADDER_SENSITIVITY_COLUMNS = ("arm", "dtype", "num_layers", "d_model", "params", "seeds",
                              "lr_sensitivity", "lr_sensitivity_low", "lr_sensitivity_high",
                              "best_lr", "best_loss", "unigram_entropy", "failed_runs", "runs")
# A drift experiment's workdir (normstudy.experiments.drift_runs trains it,
# normstudy.analysis.horizon_report reads it): the declared experiment, the fit's sweep, one
# held-out sweep per arm, and the held-out prediction, written from the fit before any held-out
# run trains and never rewritten.
DRIFT_PLAN = "drift.json"
DRIFT_FIT = "fit"
DRIFT_HELDOUT = "heldout"
DRIFT_PREDICTION = "horizon_prediction.csv"
# A search's critical learning rate per arm (normstudy.analysis.critical_lr writes it; the
# ladder's rungs and the techniques' table read it).
CRITICAL_LR = "critical_lr.csv"
# A learning-rate sweep's per-run table (normstudy.analysis writes it; a ladder's sensitivity
# rungs are read from it).
RUN_TABLE = "runs.csv"
# normstudy.context_gap's measurement, one row per evaluation row of each run (normstudy.
# experiments.context_gap writes it, normstudy.analysis.context_gap_report reads it).
CONTEXT_GAP_ROWS = "context_gap_rows.csv"
CONTEXT_GAP_ROWS_COLUMNS = ("run", "arm", "seed", "window", "row", "tokens", "loss_intact_sum",
                            "loss_spliced_sum")

# A run's statuses, as the loop writes them (run.json, sweep.json):
#   running    training, or stopped before it was done (killed: the same command continues it)
#   finished   reached its num_steps
#   halted     stopped by its non-finite policy, its consecutive-skip limit, or the fp16 loss
#              scale reaching its floor (the newest checkpoint holds the last good state)
#   preempted  stopped by SIGTERM/SIGINT or a preemption notice after checkpointing its step
RUNNING = "running"
FINISHED = "finished"
HALTED = "halted"
PREEMPTED = "preempted"


class HaltKind(enum.Enum):
  """Why a run halted, defined once: its value is run.json's `halt_kind`; `words`, what its
  halt_reason says (normstudy.core.life writes both, from the train step's code); `outcome`,
  the failure the analysis counts it as (normstudy.records.outcomes)."""
  LOSS_SCALE = "loss_scale"
  SKIPS = "skips"
  NONFINITE = "nonfinite"

  @property
  def words(self) -> str:
    return {"loss_scale": "loss scale at its minimum",  # "loss scale at its minimum (0.0001)"
            "skips": "consecutive skipped updates",  # "9 consecutive skipped updates"
            "nonfinite": "non-finite gradient"}[self.value]

  @property
  def outcome(self) -> str:
    return "halted: loss scale" if self is HaltKind.LOSS_SCALE else "halted: non-finite"


def halt_kind(info: "RunInfo") -> HaltKind:
  """A halted run's HaltKind: run.json's halt_kind, or for a run.json written before it was
  recorded, the words its halt_reason starts or ends with."""
  if info.halt_kind:
    return HaltKind(info.halt_kind)
  reason = str(info.halt_reason or "")
  if reason.startswith(HaltKind.LOSS_SCALE.words):
    return HaltKind.LOSS_SCALE
  if reason.endswith(HaltKind.SKIPS.words):
    return HaltKind.SKIPS
  return HaltKind.NONFINITE


# The failure rule's judgement of a run the loop recorded as finished whose loss diverged
# (normstudy.records.outcomes). Derived from the records, never written by the loop.
DIVERGED = "diverged"
# The statuses that count as a failure: what a search bisects on and the analysis reports.
FAILED = (HALTED, DIVERGED)


# Where a forward pass can first go non-finite, in the order it computes them: the site ids the
# model's locate probe sows (normstudy.core.telemetry) and run.json's `nonfinite_site` stores,
# and their words (the halt line, run.json's `nonfinite_at`, the analysis's kinds of death).
# "backward" is no forward site: every forward value was finite and a gradient was not.
SITE_WORDS = {
    "embedding": "embedding",
    "attn_scores": "attention scores",
    "attn_out": "attention output",
    "resid_attn": "residual stream after attention",
    "mlp_preact": "MLP pre-activation",
    "mlp_out": "MLP output",
    "resid_mlp": "residual stream after the MLP",
    "logits": "output logits",
    "backward": "backward pass only",
}
# The sites inside each layer, in the order a layer computes them.
LAYER_SITES = ("attn_scores", "attn_out", "resid_attn", "mlp_preact", "mlp_out", "resid_mlp")


@dataclasses.dataclass(frozen=True)
class Site:
  """Where a forward pass first went non-finite: `layer` (None outside the layers) and `site`,
  an id of SITE_WORDS ("backward" when every forward site was finite)."""
  layer: int | None
  site: str

  @property
  def words(self) -> str:
    return SITE_WORDS[self.site]

  def sentence(self) -> str:
    """'layer 3 residual stream after attention', 'output logits': the halt line's text."""
    return self.words if self.layer is None else f"layer {self.layer} {self.words}"

  def as_json(self) -> dict:
    return {"layer": self.layer, "site": self.site}


BACKWARD_ONLY = Site(None, "backward")


def _known(cls, obj: dict) -> tuple[dict, dict]:
  """(the keys of `obj` that are fields of `cls`, the others)."""
  names = {f.name for f in dataclasses.fields(cls)}
  return ({k: v for k, v in obj.items() if k in names},
          {k: v for k, v in obj.items() if k not in names})


# run.json's facts: written whole each time a run starts (even where a value is null).
RUN_FACTS = ("label", "name", "arm", "arm_label", "point", "overrides", "dataset",
             "entropy_floor", "unigram_entropy", "masked_loss_floor", "masked_loss_floor_stderr",
             "num_params", "tokens_per_step", "schedule_steps")
# Where a run's state is saved: written with the facts, kept out of run.json while unknown (runs
# written before it was recorded read back as they were).
RUN_PLACE = ("checkpoints", "program_index")


# run.json's fields (RunInfo):
# label, arm, arm_label  its legend label; a study's or sweep's arm (variant) and that arm's
#                        label without the sweep's point
# point, overrides       a sweep's axis values; every override that turns the arm's config
#                        into this run's (normstudy.main reproduces the run with them)
# dataset, entropy_floor, unigram_entropy, masked_loss_floor(_stderr)   the data and its
#                        reference losses (nats per token; None where the data do not know them)
# num_params, tokens_per_step, schedule_steps   the model's size, a step's tokens, the horizon
#                        of its learning-rate schedule (kept when a run is extended)
# checkpoints, program_index   where its state is saved: the checkpoint directory of the program
#                        it trains in (relative to the run's directory), and its index on the
#                        stacked checkpoints' run axis (None: written before this was recorded)
# status, last_step      RUNNING, FINISHED, HALTED or PREEMPTED; the last step it took
# finished_num_steps     the train.num_steps a finished run reached, by the step's own rule
#                        (normstudy.core.steps.reached_end: skipped steps counted or not)
# halt_step, halt_kind, halt_reason, nonfinite_at, nonfinite_site   a halted run's step, why
#                        (a HaltKind's value) and in words, and where it first went non-finite
#                        (words, and {"layer", "site"}: a Site)
# wandb_run_id           the Weights & Biases run it continues
# extra                  keys this version does not know, kept as they were
@dataclasses.dataclass(frozen=True)
class RunInfo:
  """run.json: what a run is (RUN_FACTS, written when it starts) and how its life went (its
  status and, once known, the rest, updated as it goes).
  Its fields are listed above the class."""
  label: str | None = None
  name: str | None = None
  arm: str | None = None
  arm_label: str | None = None
  point: dict = dataclasses.field(default_factory=dict)
  overrides: dict = dataclasses.field(default_factory=dict)
  dataset: str | None = None
  entropy_floor: float | None = None
  unigram_entropy: float | None = None
  masked_loss_floor: float | None = None
  masked_loss_floor_stderr: float | None = None
  num_params: int | None = None
  tokens_per_step: int | None = None
  schedule_steps: int | None = None
  checkpoints: str | None = None
  program_index: int | None = None
  status: str | None = None
  last_step: int | None = None
  finished_num_steps: int | None = None
  halt_step: int | None = None
  halt_kind: str | None = None
  halt_reason: str | None = None
  nonfinite_at: str | None = None
  nonfinite_site: dict | None = None
  wandb_run_id: str | None = None
  extra: dict = dataclasses.field(default_factory=dict)

  @classmethod
  def from_json(cls, obj: dict) -> "RunInfo":
    known, extra = _known(cls, obj)
    known.pop("extra", None)
    for key in ("point", "overrides"):
      known[key] = known.get(key) or {}
    return cls(**known, extra=extra)

  def as_json(self) -> dict:
    """The JSON object run.json holds: the facts always, the life's keys once set."""
    obj = dict(self.extra)
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if field.name != "extra" and (field.name in RUN_FACTS or value is not None):
        obj[field.name] = value
    return obj

  @property
  def loss_floor(self):
    """The lowest loss the run's objective can reach: the Bayes-optimal masked loss for masked
    prediction, else the entropy rate; None when the data do not know it."""
    return self.masked_loss_floor or self.entropy_floor

  @property
  def learning_threshold(self):
    """The eval loss a run must get below to count as having learned: halfway from the unigram
    entropy (a model that uses no context: the early plateau) to the loss floor; None without
    them."""
    if self.unigram_entropy is None or self.loss_floor is None:
      return None
    return (self.unigram_entropy + self.loss_floor) / 2

  def needs_training(self, num_steps: int) -> bool:
    """Whether the run needs (more) training to reach `num_steps`: False for a halted run, and
    for one that finished at `num_steps` by the step's rule (which, with
    train.count_skipped_steps=False, finishes past num_steps train steps; run.json written
    before finished_num_steps was recorded: at exactly num_steps)."""
    if self.status == HALTED:
      return False
    reached = self.last_step if self.finished_num_steps is None else self.finished_num_steps
    return not (self.status == FINISHED and reached == num_steps)


@dataclasses.dataclass(frozen=True)
class StudyRecord:
  """study.json: the config file a study ran, its variants in legend order, and the command
  line's overrides."""
  config: str
  variants: list
  overrides: dict

  @classmethod
  def from_json(cls, obj: dict) -> "StudyRecord":
    return cls(obj.get("config", ""), list(obj.get("variants") or []),
               dict(obj.get("overrides") or {}))

  def as_json(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BracketRecord:
  """One point's bracket after a round of a search (normstudy.experiments.search.Bracket): `low`
  survived and `high` failed once `established`."""
  low: float
  high: float
  established: bool
  widenings: int = 0


@dataclasses.dataclass(frozen=True)
class SearchPoint:
  """A point of a search: its name, arm and axis values, and its bracket after each round."""
  name: str
  arm: str
  point: dict
  brackets: list  # of BracketRecord

  @classmethod
  def from_json(cls, obj: dict) -> "SearchPoint":
    return cls(obj["name"], obj["arm"], dict(obj.get("point") or {}),
               [BracketRecord(**b) for b in obj.get("brackets") or []])

  def as_json(self) -> dict:
    return {"name": self.name, "arm": self.arm, "point": self.point,
            "brackets": [dataclasses.asdict(b) for b in self.brackets]}


@dataclasses.dataclass(frozen=True)
class SearchRecord:
  """sweep.json's `search`: the searched field, its bounds and rounds, the widening rule
  (normstudy.experiments.search), each point's brackets, and the probe round's distance from each
  midpoint in decades (0: none; absent before the probe round existed)."""
  field: str
  low: float
  high: float
  rounds: int
  widen_factor: float
  max_widenings: int
  points: list  # of SearchPoint
  probe_decades: float = 0.0

  @classmethod
  def from_json(cls, obj: dict) -> "SearchRecord":
    known, _ = _known(cls, obj)
    return cls(**{**known, "points": [SearchPoint.from_json(p) for p in obj.get("points", [])]})

  def as_json(self) -> dict:
    obj = {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
           "points": [p.as_json() for p in self.points]}
    if not self.probe_decades:  # written as before the probe round existed
      del obj["probe_decades"]
    return obj


@dataclasses.dataclass(frozen=True)
class SweepRun:
  """A run of a sweep: its name (its directory below the sweep's), arm, axis values, the
  overrides that reproduce it with normstudy.main, that command, its status as its training
  left it, and once it has records its `outcome` by the failure rule
  (normstudy.records.outcomes: the search's and the analysis's word) and the step it did not
  recover from (`failed_at`, None when it did not fail)."""
  name: str
  arm: str = ""
  point: dict = dataclasses.field(default_factory=dict)
  overrides: dict = dataclasses.field(default_factory=dict)
  command: str = ""
  status: str = RUNNING
  outcome: str | None = None
  failed_at: int | None = None

  def as_json(self) -> dict:
    obj = dataclasses.asdict(self)
    if self.outcome is None:  # not judged yet (or written before sweep.json held outcomes)
      del obj["outcome"], obj["failed_at"]
    return obj


@dataclasses.dataclass(frozen=True)
class SweepRecord:
  """sweep.json: the sweep's --config (`config`), its axes and which came from the file
  (`axes_from_file`), the experiment's settings (`settings`), the command line's overrides, its
  runs (SweepRun), a search's record (SearchRecord) when it bisected a field, and the file's
  declared experiment."""
  config: str
  axes: dict
  axes_from_file: list
  settings: dict
  overrides: dict
  runs: list  # of SweepRun
  search: SearchRecord | None = None
  # The file's declared experiment, whole (normstudy.core.experiment.Experiment.as_json; a
  # part's sweep adds "part": its name); None for a file of module tables, or written before.
  experiment: dict | None = None

  @classmethod
  def from_json(cls, obj: dict) -> "SweepRecord":
    search = obj.get("search")
    return cls(obj.get("config", ""), dict(obj.get("axes") or {}),
               list(obj.get("axes_from_file") or []), dict(obj.get("settings") or {}),
               dict(obj.get("overrides") or {}),
               [SweepRun(**_known(SweepRun, r)[0]) for r in obj.get("runs") or []],
               SearchRecord.from_json(search) if search else None, obj.get("experiment"))

  def as_json(self) -> dict:
    obj: dict[str, Any] = {"config": self.config, "axes": self.axes,
                           "axes_from_file": self.axes_from_file, "settings": self.settings,
                           "overrides": self.overrides,
                           "runs": [r.as_json() for r in self.runs]}
    if self.search is not None:
      obj["search"] = self.search.as_json()
    if self.experiment is not None:
      obj["experiment"] = self.experiment
    return obj
