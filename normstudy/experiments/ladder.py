"""A size ladder's rungs, collected: each rung is a critical-learning-rate search (`normstudy.sweep
--search=...` then `normstudy.analyze`, as `make ladder` runs them) in its own directory below the
ladder's; its model's size comes from a run's config.json, its critical learning rates from its
critical_lr.csv (normstudy.analysis.critical_lr)."""

import json
import os
import types

import pandas as pd

from normstudy.core import memory
from normstudy.records import schema


def rung_directories(workdir: str) -> list:
  """Every directory below `workdir` holding an analysed search (critical_lr.csv and
  sweep.json), in name order."""
  found = []
  for root, dirs, files in os.walk(workdir):
    dirs.sort()
    if "critical_lr.csv" in files and "sweep.json" in files:
      found.append(root)
      dirs[:] = []  # a search's runs are not rungs
  return found


def _model_of(rung: str) -> dict:
  """The `model` section of the config of the rung's first run."""
  with open(os.path.join(rung, "sweep.json"), encoding="utf-8") as f:
    runs = json.load(f)["runs"]
  with open(os.path.join(rung, runs[0]["name"], "config.json"), encoding="utf-8") as f:
    return json.load(f)["model"]


def parameters(model: dict) -> int:
  """The parameter count of a model section (normstudy.core.memory.parameter_count)."""
  return memory.parameter_count(types.SimpleNamespace(**model))


def ladder_table(workdir: str) -> pd.DataFrame:
  """ladder.csv: one row per rung and arm (LADDER_COLUMNS), from every rung below `workdir`."""
  rows = []
  for rung in rung_directories(workdir):
    model = _model_of(rung)
    found = pd.read_csv(os.path.join(rung, "critical_lr.csv"))
    for r in found.itertuples():
      rows.append({"arm": r.arm, "dtype": model["dtype"], "num_layers": model["num_layers"],
                   "d_model": model["d_model"], "params": parameters(model),
                   "critical_lr": r.critical_lr, "critical_lr_low": r.critical_lr_low,
                   "critical_lr_high": r.critical_lr_high})
  table = pd.DataFrame(rows, columns=list(schema.LADDER_COLUMNS))
  return table.sort_values(["dtype", "arm", "num_layers", "d_model"], kind="stable")


def first_model(workdir: str) -> dict:
  """The model section of the first rung's first run (what an extrapolation keeps besides its
  size: vocabulary, positions, biases)."""
  return _model_of(rung_directories(workdir)[0])
