"""Loading run directories: their records as one long table (run, label, step, metric, value),
and each run's run.json and config facts as values beside it (`Runs`).

Needs only numpy and pandas (and normstudy.records, which defines what a run writes): a notebook
can read runs without the training stack.
"""

import dataclasses
import os

import numpy as np
import pandas as pd

from normstudy.records import keys
from normstudy.records import outcomes
from normstudy.records import rundir
from normstudy.records import schema

COLUMNS = ["run", "label", "step", "metric", "value"]
RUN_FILES = (schema.METRICS, schema.CONFIG, schema.RUN, schema.STUDY, schema.SWEPT)


class NoRunsError(ValueError):
  """A directory holds no run to analyse."""


def localize(workdir: str, cache_dir: str | None = None, force_copy: bool = False) -> str:
  """A local directory with the run files of `workdir` (records, configs; no checkpoints).

  Local paths are returned as they are; `gs://...` is copied to `cache_dir` (default: a fresh
  temporary directory) first (normstudy.records.storage.pull), so pandas and matplotlib can read it.
  """
  if "://" not in workdir and not force_copy:
    return workdir
  import tempfile
  from normstudy.records import storage  # etils.epath and gcsfs, only for remote paths
  local_root = cache_dir or tempfile.mkdtemp(prefix="normstudy_")
  storage.pull(workdir, local_root, names=RUN_FILES)
  return local_root


def find_runs(workdir: str) -> list[str]:
  """Run directories (those holding metrics.jsonl) below `workdir`: a study's variants in its
  config file's order (the legend order), or a sweep's runs in sweep.json's order (arms in the
  file's order), then any others sorted by path."""
  runs = []
  for root, dirs, files in os.walk(workdir):
    dirs[:] = sorted(d for d in dirs if d not in (schema.CHECKPOINTS, schema.DAMAGED_CHECKPOINTS))
    if schema.METRICS in files:
      runs.append(root)
  order = _study(workdir).variants or [run.name for run in _sweep(workdir).runs]
  rank = {os.path.normpath(os.path.join(workdir, v)): i for i, v in enumerate(order)}
  return sorted(runs, key=lambda r: (rank.get(os.path.normpath(r), len(rank)), r))


def _unique_labels(labels: dict) -> dict:
  """Labels made unique: a label shared by several runs gets each run's name appended, so no
  two runs are ever drawn under one legend entry."""
  counts = {}
  for label in labels.values():
    counts[label] = counts.get(label, 0) + 1
  return {run: label if counts[label] == 1 else f"{label} ({run})"
          for run, label in labels.items()}


def _study(workdir: str) -> schema.StudyRecord:
  return schema.StudyRecord.from_json(rundir.read_json(os.path.join(workdir, schema.STUDY)))


def _sweep(workdir: str) -> schema.SweepRecord:
  return schema.SweepRecord.from_json(rundir.read_json(os.path.join(workdir, schema.SWEPT)))


@dataclasses.dataclass(frozen=True)
class Run:
  """One loaded run: its name (its path below the loaded directory), its legend label (unique
  among the loaded runs), its arm's label, its status (as recorded, RUNNING when run.json has
  none; halted or diverged when the failure rule says it failed), its outcome by the failure
  rule (normstudy.records.outcomes), its run.json (`info`, a schema.RunInfo), and what the
  analysis reads of its config.json: the warm-up and planned steps, the dtype, whether it is
  causal, and its eval set (eval_seed -1, also for runs that predate the field, means the masks
  of the run's own train.seed; normstudy.data.batches.eval_mask_seed) and rows; its size
  (d_model, num_layers), parametrization, learning rate, seed and the fp16 loss scale's floor
  (min_scale; None without a loss scaler)."""
  name: str
  label: str
  arm_label: str
  status: str
  outcome: outcomes.Outcome
  info: schema.RunInfo
  warmup_steps: int = 0
  num_steps: int | None = None
  dtype: str | None = None
  causal: bool = True
  eval_seed: int = -1
  eval_rows: int = 0
  d_model: int | None = None
  num_layers: int | None = None
  parametrization: str = "sp"
  learning_rate: float | None = None
  min_scale: float | None = None
  seed: int | None = None

  @classmethod
  def from_files(cls, name: str, info: schema.RunInfo, config: dict, records: list) -> "Run":
    label = info.label or config.get("label") or name
    train, model = config.get("train", {}), config.get("model", {})
    optimizer = config.get("optimizer", {})
    warmup = optimizer.get("warmup_steps", 0)
    scaler = optimizer.get("loss_scale", {})
    scaled = model.get("dtype") == "float16" and scaler.get("kind", "dynamic") != "none"
    ended = outcomes.judge(
        [r[keys.STEP] for r in records], [r.get(keys.LOSS, float("nan")) for r in records],
        [r.get(keys.SKIPPED, False) for r in records],
        {r[keys.STEP]: r[keys.EVAL_LOSS] for r in records if keys.EVAL_LOSS in r}, info, warmup)
    recorded = info.status or schema.RUNNING
    return cls(name=name, label=label, arm_label=info.arm_label or label,
               status=ended.status if ended.failed else recorded, outcome=ended, info=info,
               warmup_steps=warmup,
               num_steps=train.get("num_steps"), dtype=model.get("dtype"),
               causal=model.get("causal", True), eval_seed=train.get("eval_seed", -1),
               eval_rows=train.get("eval_steps", 0) * train.get("batch_size", 0),
               d_model=model.get("d_model"), num_layers=model.get("num_layers"),
               parametrization=model.get("parametrization", "sp"),
               learning_rate=optimizer.get("learning_rate"),
               min_scale=scaler.get("min_scale", 1e-4) if scaled else None,
               seed=train.get("seed"))

  @property
  def floor(self):
    """The lowest loss the run's objective can reach (schema.RunInfo.loss_floor)."""
    return self.info.loss_floor


@dataclasses.dataclass(frozen=True)
class Runs:
  """Runs loaded from a directory (`load_runs`): `table`, their records in long form (run,
  label, step, metric, value; a non-finite value stays as NaN or inf, a metric a record does not
  have is absent), `runs`, each run's facts (a Run) by name in the table's order, `search`,
  sweep.json's search record (a schema.SearchRecord) when the directory holds a search, and
  `experiment`, the experiment its sweep.json records (normstudy.core.experiment), if any."""
  table: pd.DataFrame
  runs: dict
  search: schema.SearchRecord | None = None
  experiment: dict | None = None

  def __post_init__(self):
    # Each (run, metric)'s rows, indexed once: a run's series is then a lookup, not a scan.
    columns = {name: self.table[name].to_numpy() for name in ("run", "metric", "step", "value")}
    groups = pd.DataFrame({"run": columns["run"], "metric": columns["metric"]}).groupby(
        ["run", "metric"], sort=False).indices
    series = {key: (columns["step"][rows], columns["value"][rows]) for key, rows in groups.items()}
    by_run = {}
    for (run, metric), values in series.items():
      by_run.setdefault(run, {})[metric] = values
    object.__setattr__(self, "_series", series)
    object.__setattr__(self, "_by_run", by_run)

  @property
  def names(self) -> list:
    """The runs' names, in order."""
    return list(self.runs)

  def __getitem__(self, name: str) -> Run:
    return self.runs[name]

  def __len__(self) -> int:
    return len(self.runs)

  def series(self, run: str, metric: str) -> pd.Series:
    """One run's metric as a Series indexed by step (non-finite values kept)."""
    steps, values = self._series.get((run, metric), (np.array([], int), np.array([])))
    return pd.Series(values, index=steps, name=metric)

  def has_metric(self, metric: str) -> bool:
    return any(metric in metrics for metrics in self._by_run.values())

  def layer_values(self, run: str, metric: str) -> pd.DataFrame:
    """Telemetry `metric/layer_<i>` of a run as a table: rows = layers, columns = steps."""
    layers = {}
    for key, (steps, values) in self._by_run.get(run, {}).items():
      parsed = keys.parse_layer_key(key)
      if parsed is not None and parsed[0] == metric:
        layers[parsed[1]] = pd.Series(values, index=steps)
    if not layers:
      return pd.DataFrame()
    table = pd.DataFrame({layer: layers[layer] for layer in sorted(layers)}).T
    table.index.name, table.columns.name = "layer", "step"
    return table

  def head_values(self, run: str, metric: str) -> pd.DataFrame:
    """Per-head telemetry `metric/layer_<i>/head_<j>` of a run as a table: rows = (layer, head),
    columns = steps."""
    heads = {}
    for key, (steps, values) in self._by_run.get(run, {}).items():
      parsed = keys.parse_head_key(key)
      if parsed is not None and parsed[0] == metric:
        heads[parsed[1:]] = pd.Series(values, index=steps)
    if not heads:
      return pd.DataFrame()
    table = pd.DataFrame({k: heads[k] for k in sorted(heads)}).T
    table.index.names, table.columns.name = ["layer", "head"], "step"
    return table


def load_runs(workdir: str) -> Runs:
  """Every run below `workdir` (a directory holding a metrics.jsonl with a record): its records
  as one long table and its facts (Runs). `run` is the run's path relative to `workdir`; `label`
  its legend label (from run.json, else config.json, else the run's name), unique per run (a
  label shared by several runs gets each run's name appended)."""
  frames, facts = [], {}
  for run_dir in find_runs(workdir):
    run = os.path.relpath(run_dir, workdir)
    files = rundir.RunDir(run_dir)
    records = files.records()
    if not records:
      continue
    facts[run] = Run.from_files(run, files.info(), files.saved_config(), records)
    rows = [(record["step"], key, value) for record in records for key, value in record.items()
            if key != "step" and isinstance(value, (int, float, bool))]
    long = pd.DataFrame(rows, columns=["step", "metric", "value"])
    long["value"] = long["value"].astype(float)
    long.insert(0, "run", run)
    frames.append(long)
  labels = _unique_labels({run: fact.label for run, fact in facts.items()})
  facts = {run: dataclasses.replace(fact, label=labels[run]) for run, fact in facts.items()}
  table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
      columns=["run", "step", "metric", "value"])
  table.insert(1, "label", table.run.map(labels) if len(table) else [])
  sweep = _sweep(workdir)
  return Runs(table[COLUMNS], facts, sweep.search, sweep.experiment)


def seed_groups(loaded: Runs) -> dict | None:
  """{arm: [run names]} when the runs differ only in their arm and seed and some arm has two or
  more seeds (normstudy.study --seeds, a sweep of seeds alone), else None: such arms are drawn
  as their median and range."""
  groups, seeds = {}, {}
  if any(set(facts.info.point) - {"train.seed"} for facts in loaded.runs.values()):
    return None
  for run, facts in loaded.runs.items():
    groups.setdefault(facts.info.arm, []).append(run)
    if "train.seed" in facts.info.point:
      seeds.setdefault(facts.info.arm, set()).add(facts.info.point["train.seed"])
  return groups if any(len(s) > 1 for s in seeds.values()) else None


def outcome_at(loaded: Runs, run: str, horizon: int) -> outcomes.Outcome:
  """How `run` ended by the failure rule at `horizon` steps: its records after it left out
  (normstudy.records.outcomes.judge)."""
  facts = loaded[run]
  loss = loaded.series(run, keys.LOSS)
  skipped = loaded.series(run, keys.SKIPPED).reindex(loss.index, fill_value=0.0)
  evals = loaded.series(run, keys.EVAL_LOSS)
  return outcomes.judge(loss.index.to_numpy(), loss.to_numpy(dtype=float),
                        skipped.to_numpy() > 0, dict(zip(evals.index, evals.to_numpy())),
                        facts.info, facts.warmup_steps, horizon)


def series(loaded: Runs, run: str, metric: str) -> pd.Series:
  """One run's metric as a Series indexed by step (non-finite values kept)."""
  return loaded.series(run, metric)


def has_metric(loaded: Runs, metric: str) -> bool:
  return loaded.has_metric(metric)


def layer_values(loaded: Runs, run: str, metric: str) -> pd.DataFrame:
  """Telemetry `metric/layer_<i>` of a run as a table: rows = layers, columns = steps."""
  return loaded.layer_values(run, metric)


def learning_threshold(table: pd.DataFrame) -> float:
  """The eval loss a run must get below to count as having learned: halfway from the unigram
  entropy (a model that uses no context: the early plateau) to the loss floor, from a table
  with `unigram_entropy` and `floor` columns; NaN without them."""
  unigram, floor = table.unigram_entropy.dropna(), table.floor.dropna()
  if unigram.empty or floor.empty:
    return np.nan
  return float((unigram.iloc[0] + floor.iloc[0]) / 2)


def smooth(values: pd.Series, weight: float) -> pd.Series:
  """TensorBoard-style exponential moving average (weight 0 = raw), debiased at the start;
  non-finite values are skipped by the average and kept as NaN."""
  if weight <= 0:
    return values
  out, last, norm = [], 0.0, 0.0
  for v in values.to_numpy(dtype=float):
    if np.isfinite(v):
      last = weight * last + (1 - weight) * v
      norm = weight * norm + (1 - weight)
      out.append(last / norm)
    else:
      out.append(np.nan)
  return pd.Series(out, index=values.index, name=values.name)
