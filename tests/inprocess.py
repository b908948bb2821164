"""In-process helpers of the tests: what the library itself never needs (one run's unboxed train
state from its config, its hyperparameters as the optimizer reads them, a checkpoint's restore
skeleton, runs trained without a command)."""

import functools
import json

import jax
import ml_collections

from normstudy.core import per_run
from normstudy.core import steps as steps_lib
from normstudy.experiments import planning


@functools.lru_cache(maxsize=16)
def _initializer(frozen_config: str):
  config = ml_collections.ConfigDict(json.loads(frozen_config))
  return jax.jit(lambda values: steps_lib.unboxed(steps_lib.init_state(config, values)))


def create_train_state(config, params=None) -> steps_lib.TrainState:
  """The state of one run, unboxed, from its config (jitted: one compiled initialiser per
  config), or around the given parameters."""
  values = per_run.run_values(config)
  if params is not None:
    return steps_lib.unboxed(steps_lib.init_state(config, values, params))
  frozen = json.dumps(json.loads(config.to_json_best_effort()), sort_keys=True)
  return _initializer(frozen)(values)


def hyperparameters(config) -> dict:
  """float32 scalars of a run's optimizer hyperparameters (normstudy.core.optimizer reads
  them)."""
  return per_run.run_values(config)["hparams"]


def abstract(tree):
  """The shape/dtype/sharding skeleton orbax restores into."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
      tree)


def train_programs(runs: list, root: str, allow_config_change: bool = False,
                   max_runs: int = 0, workers: int = 1) -> dict:
  """Trains every run (grouped into programs, checked first) with stacked checkpoints under
  `root/checkpoints/<program>/`, as a study or sweep does; returns {run name: status}. Runs
  recorded as finished or halted are not trained again."""
  return planning.train_plan(planning.plan_programs(None, root, runs, allow_config_change,
                                                    max_runs, workers))
