"""A size ladder's rungs, collected: each rung is a critical-learning-rate search (`normstudy.sweep
--search=...` then `normstudy.analyze`, as `make ladder` runs them) in its own directory below the
ladder's; its model's size comes from a run's config.json, its critical learning rates from its
critical_lr.csv (normstudy.analysis.critical_lr)."""

import dataclasses
import json
import os
import types

import pandas as pd

from normstudy.engine import memory
from normstudy.errors import UserError
from normstudy.experiments import workers as workers_lib
from normstudy.records import rundir
from normstudy.records import schema


def rung_directories(workdir: str) -> list:
  """Every directory below `workdir` holding an analysed search (critical_lr.csv and
  sweep.json), in name order."""
  found = []
  for root, dirs, files in os.walk(workdir):
    dirs.sort()
    if schema.CRITICAL_LR in files and schema.SWEPT in files:
      found.append(root)
      dirs[:] = []  # a search's runs are not rungs
  return found


def _model_of(rung: str) -> dict:
  """The `model` section of the config of the rung's first run. UserError when the rung's run
  directories are not there (an analysed search whose tables alone were kept, as docs/ keeps
  them): a ladder reads each rung's model from its runs."""
  runs = rundir.read_sweep(rung).runs
  config = rundir.read_config(os.path.join(rung, runs[0].name)) if runs else {}
  if "model" not in config:
    where = os.path.join(rung, runs[0].name, schema.CONFIG) if runs else rung
    raise UserError(f"{rung} holds an analysed search but not its runs ({where} is missing): "
                    "normstudy.ladder reads each rung's model from its runs; give it a ladder's "
                    "workdir as `make ladder` trains it")
  return config["model"]


def parameters(model: dict) -> int:
  """The parameter count of a model section (normstudy.engine.memory.parameter_count)."""
  return memory.parameter_count(types.SimpleNamespace(**model))


def ladder_table(workdir: str) -> pd.DataFrame:
  """ladder.csv: one row per rung and arm (LADDER_COLUMNS), from every rung below `workdir`."""
  rows = []
  for rung in rung_directories(workdir):
    model = _model_of(rung)
    found = pd.read_csv(os.path.join(rung, schema.CRITICAL_LR))
    for r in found.itertuples():
      rows.append({"arm": r.arm, "dtype": model["dtype"], "num_layers": model["num_layers"],
                   "d_model": model["d_model"], "params": parameters(model),
                   "critical_lr": r.critical_lr, "critical_lr_low": r.critical_lr_low,
                   "critical_lr_high": r.critical_lr_high})
  table = pd.DataFrame(rows, columns=list(schema.LADDER_COLUMNS))
  return table.sort_values(["dtype", "arm", "num_layers", "d_model"], kind="stable")


def search_rungs(workdir: str) -> list:
  """[(size, runs, clip_norms)] for every search rung below `workdir` whose analysis wrote
  runs.csv: size {dtype, num_layers, d_model}, runs its runs.csv (a probe per row), clip_norms
  {arm: optimizer.clip_norm} from each arm's first run's config.json."""
  out = []
  for rung in rung_directories(workdir):
    path = os.path.join(rung, schema.RUN_TABLE)
    if not os.path.isfile(path):
      continue  # analysed before runs.csv was written for a search
    model = _model_of(rung)
    clip_norms = {}
    for run in rundir.read_sweep(rung).runs:
      if run.arm not in clip_norms:
        config = rundir.read_config(os.path.join(rung, run.name))
        clip_norms[run.arm] = float(config.get("optimizer", {}).get("clip_norm", float("nan")))
    out.append(({"dtype": model["dtype"], "num_layers": model["num_layers"],
                 "d_model": model["d_model"]}, pd.read_csv(path), clip_norms))
  return out


def sensitivity_directories(workdir: str) -> list:
  """Every directory below `workdir` holding an analysed learning-rate grid that is not a search
  (runs.csv and sweep.json without critical_lr.csv: a rung of a sensitivity ladder), in name
  order."""
  found = []
  for root, dirs, files in os.walk(workdir):
    dirs.sort()
    if schema.SWEPT in files:
      if schema.RUN_TABLE in files and schema.CRITICAL_LR not in files:
        found.append(root)
      dirs[:] = []  # a sweep's runs are not rungs
  return found


def sensitivity_rungs(workdir: str) -> list:
  """[(size, runs)] for every sensitivity rung below `workdir`: size {dtype, num_layers,
  d_model, params} from a run's config, runs its runs.csv."""
  out = []
  for rung in sensitivity_directories(workdir):
    model = _model_of(rung)
    runs = pd.read_csv(os.path.join(rung, schema.RUN_TABLE))
    if "learning_rate" not in runs or runs.learning_rate.nunique() < 2:
      continue  # a sweep of something else
    out.append(({"dtype": model["dtype"], "num_layers": model["num_layers"],
                 "d_model": model["d_model"], "params": parameters(model)}, runs))
  return out


def first_model(workdir: str) -> dict:
  """The model section of the first rung's first run (what an extrapolation keeps besides its
  size: vocabulary, positions, biases)."""
  return _model_of(rung_directories(workdir)[0])


def arm_parametrizations(workdir: str) -> dict:
  """{arm: its model.parametrization} over every rung below `workdir` (a run's config.json per
  arm; "sp" where the field predates it)."""
  out = {}
  for rung in rung_directories(workdir):
    for run in rundir.read_sweep(rung).runs:
      if run.arm in out:
        continue
      model = rundir.read_config(os.path.join(rung, run.name))["model"]
      out[run.arm] = model.get("parametrization", "sp")
  return out


def recorded_transfer(workdir: str) -> dict | None:
  """The transfer spec ladder.json recorded (transfer_spec), or None."""
  path = os.path.join(workdir, LADDER_PLAN)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f).get("transfer")


# --- Training a ladder: each rung a critical-learning-rate search, as its own `normstudy.sweep`.

LADDER_PLAN = "ladder.json"


@dataclasses.dataclass(frozen=True)
class Rung:
  """One rung of a ladder: a search of the config file's arms at one size and dtype, in
  `directory` (relative to the ladder's), trained by `argv` (normstudy.sweep's arguments)."""
  dtype: str
  num_layers: int
  d_model: int
  directory: str
  argv: tuple

  def command(self, python: str = "python") -> str:
    """The shell line that trains (or resumes) this rung alone."""
    import shlex
    return " ".join([python, "-m", "normstudy.sweep", *map(shlex.quote, self.argv)])


def ladder_spec(declared, path: str) -> dict:
  """What a ladder config file's EXPERIMENT declares in its Ladder, checked (UserError naming
  the file and the field): rungs [(num_layers, d_model)], dtypes, rung_overrides(num_layers,
  d_model) -> {dotted field: value}, and what each rung measures, one of: search (the critical
  learning rate by search, configs/ladder.py) or learning_rates (a grid for the LR
  sensitivity, configs/ladder_sensitivity.py). Returns {"rungs", "dtypes", "search" (or None),
  "learning_rates" (or None)}."""
  from normstudy.experiments import search as search_lib
  ladder = declared.ladder
  if ladder is None or ladder.parts:
    raise UserError(f"--config={path} is not a ladder: its EXPERIMENT declares no "
                    "ladder=Ladder(rungs=..., dtypes=..., rung_overrides=..., search=...) "
                    "(configs/ladder.py and configs/ladder_sensitivity.py show one)")
  missing = [name for name in ("rungs", "dtypes", "rung_overrides")
             if not getattr(ladder, name)]
  if (ladder.search is None) == (not ladder.learning_rates):
    missing.append("exactly one of search and learning_rates")
  if missing:
    raise UserError(f"--config={path} is not a ladder: its Ladder does not declare "
                    f"{', '.join(missing)} (configs/ladder.py and configs/ladder_sensitivity.py "
                    "show them)")
  rungs = [tuple(r) for r in ladder.rungs]
  bad = [r for r in rungs if len(r) != 2 or not all(isinstance(v, int) and v >= 1 for v in r)]
  if bad:
    raise UserError(f"{path}: Ladder's rungs={list(ladder.rungs)!r} is not allowed; allowed: a "
                    "non-empty list of (num_layers, d_model) pairs of integers >= 1")
  if len(set(rungs)) != len(rungs):
    raise UserError(f"{path}: Ladder's rungs list a rung twice: {rungs}")
  dtypes = list(ladder.dtypes)
  wrong = [d for d in dtypes if d not in ("float16", "bfloat16", "float32")]
  if wrong or len(set(dtypes)) != len(dtypes):
    raise UserError(f"{path}: Ladder's dtypes={ladder.dtypes!r} is not allowed; allowed: "
                    "distinct names among float16, bfloat16, float32")
  if ladder.learning_rates:
    lrs = list(ladder.learning_rates)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                  for v in lrs)
    if len(lrs) < 2 or not numbers or len(set(lrs)) != len(lrs):
      raise UserError(f"{path}: Ladder's learning_rates={ladder.learning_rates!r} is not "
                      "allowed; allowed: at least 2 distinct learning rates > 0")
    return {"rungs": rungs, "dtypes": dtypes, "search": None, "learning_rates": sorted(lrs)}
  s = ladder.search
  search_ = search_lib.Search.parse(f"{s.field}:{s.low},{s.high}", int(s.rounds),
                                    float(s.probe_decades))
  return {"rungs": rungs, "dtypes": dtypes, "search": search_, "learning_rates": None}


def ladder_parts(declared, path: str, load) -> list:
  """[(part name, path, Experiment)]: a Ladder declaring parts ({name: ladder file},
  configs/ladder_mup.py) is those files, each trained into DIR/<name>/; any other ladder file
  is itself, one part named "". `load(path)` loads a file's Experiment (normstudy.experiments.
  grid's). UserError for parts of another shape or naming a file that is not a ladder."""
  parts = declared.ladder.parts if declared.ladder is not None else {}
  if not parts:
    return [("", path, declared)]
  if not isinstance(parts, dict) or not all(
      isinstance(k, str) and k and "/" not in k and isinstance(v, str) for k, v in parts.items()):
    raise UserError(f"{path}: Ladder's parts={parts!r} is not allowed; allowed: a non-empty "
                    "{part name: ladder file path}")
  out = []
  for name, part_path in parts.items():
    part = load(part_path)
    ladder_spec(part, part_path)
    out.append((name, part_path, part))
  return out


def transfer_spec(declared) -> dict | None:
  """What a ladder of parts declares for ladder_parametrization.csv: {"reference": the sp
  ladder's ladder.csv, "arms": {arm: its sp arm}} (its Ladder's Transfer), or None."""
  transfer = declared.ladder.transfer if declared.ladder is not None else None
  if transfer is None:
    return None
  return {"reference": transfer.reference, "arms": dict(transfer.arms)}


def plan_rungs(path: str, declared, dtypes=None, part: str = "") -> list:
  """Every rung of the ladder file `path` (its Experiment, `declared`), dtype by dtype, in the
  file's order: each a Rung whose argv trains its search (or its learning-rate grid, as an axis
  of the sweep) into `[<part>/]<dtype>/L<layers>_d<width>`."""
  spec = ladder_spec(declared, path)
  search_ = spec["search"]
  if search_ is not None:
    measure = (f"--search={search_.field}:{search_.low:g},{search_.high:g}",
               f"--rounds={search_.rounds}", f"--probe_decades={search_.probe_decades:g}")
  else:
    measure = ("--axis=optimizer.learning_rate="
               + ",".join(f"{lr:g}" for lr in spec["learning_rates"]),)
  out = []
  for dtype in dtypes or spec["dtypes"]:
    for num_layers, d_model in spec["rungs"]:
      directory = os.path.join(part, dtype, f"L{num_layers}_d{d_model}")
      overrides = {"model.dtype": dtype,
                   **declared.ladder.rung_overrides(num_layers, d_model)}
      argv = (f"--config={path}", *measure,
              *(f"--config.{k}={v}" for k, v in overrides.items()))
      out.append(Rung(dtype, num_layers, d_model, directory, argv))
  return out


def headroom_heldout(declared, path: str) -> set:
  """The rungs a headroom ladder holds out ({(num_layers, d_model)}, its Ladder's heldout:
  trained after the prediction from the others; the Ladder then declares rung_steps(num_layers,
  d_model) too), or an empty set. UserError for one that is not among its rungs."""
  ladder = declared.ladder
  if ladder is None or not ladder.heldout:
    return set()
  rungs = {tuple(r) for r in ladder.rungs}
  held = {tuple(r) for r in ladder.heldout}
  if not held <= rungs or not callable(ladder.rung_steps):
    raise UserError(f"{path}: Ladder's heldout={sorted(held)} must name rungs of its rungs "
                    "and come with rung_steps(num_layers, d_model)")
  if held == rungs:
    raise UserError(f"{path}: Ladder's heldout holds out every rung; nothing is left to fit "
                    "the prediction to")
  return held


def train_rungs(rungs: list, workdir: str, extra_argv=(), log=print, transfer=None,
                recorded=None) -> None:
  """Trains every rung in turn, each `python -m normstudy.sweep ARGV --workdir=workdir/<rung>`
  in its own process (a finished rung's search trains nothing again: re-running resumes),
  writing ladder.json (each rung's directory and command) first and logging progress with an
  ETA from the rungs done. A rung that fails stops the ladder: RuntimeError naming it (its own
  lines say why), or UserError when the sweep refused its input. `transfer` (transfer_spec's)
  is recorded in ladder.json for the analysis; `recorded`: the rungs ladder.json lists (default
  `rungs`: a ladder trained in stages lists all of them each time)."""
  import sys
  import time
  plan = {"rungs": [{"dtype": r.dtype, "num_layers": r.num_layers, "d_model": r.d_model,
                     "directory": r.directory,
                     "command": r.command() + f" --workdir={os.path.join(workdir, r.directory)}"
                     + "".join(f" {a}" for a in extra_argv)} for r in recorded or rungs]}
  if transfer is not None:
    plan["transfer"] = transfer
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, LADDER_PLAN), "w", encoding="utf-8") as f:
    json.dump(plan, f, indent=2)
  start, trained = time.monotonic(), []
  for i, rung in enumerate(rungs, start=1):
    directory = os.path.join(workdir, rung.directory)
    finished = os.path.exists(os.path.join(directory, schema.CRITICAL_LR))
    log(f"[ladder] rung {i}/{len(rungs)}: {rung.dtype}, {rung.num_layers} layers x "
        f"{rung.d_model} wide, into {directory}" + (" (finished earlier)" if finished else ""))
    began = time.monotonic()
    done, = workers_lib.run_commands([[sys.executable, "-m", "normstudy.sweep", *rung.argv,
                                       f"--workdir={directory}", *extra_argv]])
    if done == 2:
      raise UserError(f"rung {rung.directory}: normstudy.sweep refused its input (above)")
    if done != 0:
      raise RuntimeError(f"rung {rung.directory} stopped with exit code {done}; re-running "
                         "the ladder resumes it")
    if not finished:
      trained.append((rung_size(rung), time.monotonic() - began))
    eta = rungs_eta(trained, [rung_size(r) for r in rungs[i:]])
    log(f"[ladder] rungs {i}/{len(rungs)} done | {time.monotonic() - start:.0f}s so far | "
        + (f"ETA {eta:.0f}s (the rungs left by a fit of the {len(trained)} trained here: "
           "seconds = a + b x layers x width^2)" if eta is not None else
           "ETA after a rung trained here (the ones done were finished earlier)"))


def rung_size(rung: Rung) -> float:
  """A rung's size for the ETA: layers x width^2 (the blocks' parameters, to a constant)."""
  return float(rung.num_layers * rung.d_model ** 2)


def rungs_eta(trained: list, left: list):
  """Seconds until the rungs of sizes `left` are trained, from (size, seconds) of the rungs
  trained so far: their mean while they are all one size, else a least-squares line seconds =
  a + b x size (a and b at least 0: a rung's compiles and fixed work, its steps); None before
  any."""
  if not trained:
    return None
  sizes, seconds = zip(*trained)
  if len(set(sizes)) < 2:
    return sum(seconds) / len(seconds) * len(left)
  n = len(sizes)
  mean_x, mean_y = sum(sizes) / n, sum(seconds) / n
  slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in trained)
              / sum((x - mean_x) ** 2 for x in sizes))
  intercept = max(0.0, mean_y - slope * mean_x)
  return sum(intercept + slope * x for x in left)
