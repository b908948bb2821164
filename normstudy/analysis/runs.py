"""Loading run directories into one long table (run, label, step, metric, value).

Needs only numpy and pandas: a notebook can read runs without the training stack.
"""

import os
import weakref

import numpy as np
import pandas as pd

from normstudy import life
from normstudy import metrics as metrics_lib
from normstudy import rundir
from normstudy import telemetry

COLUMNS = ["run", "label", "step", "metric", "value"]
RUN_FILES = (rundir.METRICS, rundir.CONFIG, rundir.RUN, rundir.STUDY, rundir.SWEEP)


class NoRunsError(ValueError):
  """A directory holds no run to analyse."""


def localize(workdir: str, cache_dir: str | None = None, force_copy: bool = False) -> str:
  """A local directory with the run files of `workdir` (records, configs; no checkpoints).

  Local paths are returned as they are; `gs://...` is copied to `cache_dir` (default: a fresh
  temporary directory) first (normstudy.storage.pull), so pandas and matplotlib can read it.
  """
  if "://" not in workdir and not force_copy:
    return workdir
  import tempfile
  from normstudy import storage  # etils.epath and gcsfs, only for remote paths
  local_root = cache_dir or tempfile.mkdtemp(prefix="normstudy_")
  storage.pull(workdir, local_root, names=RUN_FILES)
  return local_root


def find_runs(workdir: str) -> list[str]:
  """Run directories (those holding metrics.jsonl) below `workdir`: a study's variants in its
  config file's order (the legend order), or a sweep's runs in sweep.json's order (arms in the
  file's order), then any others sorted by path."""
  runs = []
  for root, dirs, files in os.walk(workdir):
    dirs[:] = sorted(d for d in dirs if d not in (rundir.CHECKPOINTS, rundir.DAMAGED_CHECKPOINTS))
    if rundir.METRICS in files:
      runs.append(root)
  order = rundir.read_json(os.path.join(workdir, rundir.STUDY)).get("variants", []) or [
      run["name"] for run in rundir.read_json(os.path.join(workdir, rundir.SWEEP)).get("runs", [])]
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


def load_runs(workdir: str) -> pd.DataFrame:
  """Every run below `workdir` as a long table: run, label, step, metric, value.

  `run` is the run's path relative to `workdir`; `label` its legend label (from run.json, else
  config.json, else the run's name), unique per run. A non-finite value (a diverged loss) stays
  in the table as NaN or inf; a metric a record does not have is absent. Run-level facts are in
  `df.attrs["runs"][run]`: label, entropy floor, warm-up and planned steps, dtype, status
  (finished | halted | preempted | running), halt step and reason, where a halted run first went
  non-finite (`nonfinite_site`: layer and site), the sweep's axis values (`point`) and the
  overrides that reproduce the run. `df.attrs["search"]`: sweep.json's search record, if any.
  """
  frames, infos = [], {}
  for run_dir in find_runs(workdir):
    run = os.path.relpath(run_dir, workdir)
    records = list(metrics_lib.read_records(os.path.join(run_dir, rundir.METRICS),
                                            skip_damaged=True))
    if not records:
      continue
    info = rundir.read_json(os.path.join(run_dir, rundir.RUN))
    config = rundir.read_json(os.path.join(run_dir, rundir.CONFIG))
    label = info.get("label") or config.get("label") or run
    infos[run] = {
        "label": label,
        "arm": info.get("arm"),
        "arm_label": info.get("arm_label") or label,  # the arm's, without the sweep's point
        "point": info.get("point") or {},  # the sweep's axis values
        "overrides": info.get("overrides") or {},
        "entropy_floor": info.get("entropy_floor"),
        "warmup_steps": config.get("optimizer", {}).get("warmup_steps", 0),
        "num_steps": config.get("train", {}).get("num_steps"),
        "dtype": config.get("model", {}).get("dtype"),
        "causal": config.get("model", {}).get("causal", True),
        "unigram_entropy": info.get("unigram_entropy"),
        "masked_loss_floor": info.get("masked_loss_floor"),
        # The eval set (normstudy.data.eval_mask_seed): -1, also for runs that predate the
        # field, means the masks of the run's own train.seed.
        "eval_seed": config.get("train", {}).get("eval_seed", -1),
        "eval_rows": (config.get("train", {}).get("eval_steps", 0)
                      * config.get("train", {}).get("batch_size", 0)),
        "status": info.get("status", life.RUNNING),
        "halt_step": info.get("halt_step"),
        "halt_reason": info.get("halt_reason"),
        "nonfinite_at": info.get("nonfinite_at"),
        "nonfinite_site": info.get("nonfinite_site"),  # {"layer": int or None, "site": str}
    }
    rows = [(record["step"], key, value) for record in records for key, value in record.items()
            if key != "step" and isinstance(value, (int, float, bool))]
    long = pd.DataFrame(rows, columns=["step", "metric", "value"])
    long["value"] = long["value"].astype(float)
    long.insert(0, "run", run)
    frames.append(long)
  labels = _unique_labels({run: info["label"] for run, info in infos.items()})
  for run, label in labels.items():
    infos[run]["label"] = label
  df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
      columns=["run", "step", "metric", "value"])
  df.insert(1, "label", df.run.map(labels) if len(df) else [])
  df = df[COLUMNS]
  df.attrs["runs"] = infos
  # A search's record (normstudy.search: each point's brackets), for its report.
  df.attrs["search"] = rundir.read_json(os.path.join(workdir, rundir.SWEEP)).get("search")
  return df


def loss_floor(info: dict):
  """The lowest loss a run's objective can reach, from its run.json: the Bayes-optimal masked
  loss for masked prediction, else the entropy rate; None when the data do not know it."""
  return info.get("masked_loss_floor") or info.get("entropy_floor")


def learning_threshold(table: pd.DataFrame) -> float:
  """The eval loss a run must get below to count as having learned: halfway from the unigram
  entropy (a model that uses no context: the early plateau) to the loss floor, from a table
  with `unigram_entropy` and `floor` columns; NaN without them."""
  unigram, floor = table.unigram_entropy.dropna(), table.floor.dropna()
  if unigram.empty or floor.empty:
    return np.nan
  return float((unigram.iloc[0] + floor.iloc[0]) / 2)


# Per loaded table, the rows of each (run, metric): a run's series is then a lookup. Selecting
# with boolean masks costs a deep copy of df.attrs (every run's run.json) per operation (pandas
# 3.1 propagates attrs so), which made a 216-run analysis take minutes.
_ROWS = {}


def _rows_by_series(df: pd.DataFrame) -> dict:
  cached = _ROWS.get(id(df))
  if cached is not None and cached[0]() is df and cached[1] == len(df):
    return cached[2]
  columns = {name: df[name].to_numpy() for name in ("run", "metric", "step", "value")}
  groups = pd.DataFrame({"run": columns["run"], "metric": columns["metric"]}).groupby(
      ["run", "metric"], sort=False).indices
  by_series = {key: (columns["step"][rows], columns["value"][rows])
               for key, rows in groups.items()}
  for key in [k for k, v in _ROWS.items() if v[0]() is None]:
    del _ROWS[key]
  _ROWS[id(df)] = (weakref.ref(df), len(df), by_series)
  return by_series


def series(df: pd.DataFrame, run: str, metric: str) -> pd.Series:
  """One run's metric as a Series indexed by step (non-finite values kept)."""
  steps, values = _rows_by_series(df).get((run, metric), (np.array([], int), np.array([])))
  return pd.Series(values, index=steps, name=metric)


def has_metric(df: pd.DataFrame, metric: str) -> bool:
  return bool((df.metric == metric).any())


def layer_values(df: pd.DataFrame, run: str, metric: str) -> pd.DataFrame:
  """Telemetry `metric/layer_<i>` of a run as a table: rows = layers, columns = steps."""
  rows = df[(df.run == run) & df.metric.str.startswith(f"{metric}/layer_")]
  if rows.empty:
    return pd.DataFrame()
  layers = [telemetry.parse_layer_key(m)[1] for m in rows.metric]
  table = rows.assign(layer=layers).pivot(index="layer", columns="step", values="value")
  return table.sort_index()


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
