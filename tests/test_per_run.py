"""Per-run fields (normstudy.core.per_run): each one, set two ways in two runs of one program,
trains each run with its own value, step for step as that run trains alone.

The program's step is built from the first run's config, so a per-run field that the step read
from the config instead of the state would train the second run with the first run's value and
fail here. Each scenario is chosen so that the field changes the trajectory within a few steps
(checked too, so no scenario passes vacuously), and every field of the table needs one."""

import json

import jax
import numpy as np
import pytest

from normstudy.core import config as config_lib
from normstudy.core import life
from normstudy.core import per_run
from normstudy.engine import execution
from normstudy.engine import sharding
import inprocess

STEPS = 8
# What a step reports that a per-run field can change.
OBSERVED = ("loss", "grad_norm", "lr", "loss_scale", "skipped", "clipped", "status")

# field -> (settings of run a, settings of run b): the same but for that field. Skips come from
# a float16 loss scale far above float16's range (it halves on every overflow) or, in float32,
# from a learning rate so large that the second step's forward pass overflows. Runs that share
# settings are one run (trained once alone, once in the program).
FP16 = {"model.dtype": "float16"}
HIGH = {**FP16, "optimizer.loss_scale.initial_scale": 2.0**28}
BLOWUP = {"optimizer.learning_rate": 1e30, "optimizer.clip_norm": 0.0,
          "train.on_nonfinite": "skip", "train.max_consecutive_skips": 1}
SHORT = {**HIGH, "train.num_steps": 4}


def _one(field, value, base=None):
  return (dict(base or {}), {**(base or {}), field: value})


SCENARIOS = {
    "train.seed": _one("train.seed", 1),
    "optimizer.learning_rate": _one("optimizer.learning_rate", 3e-3),
    "optimizer.end_learning_rate": _one("optimizer.end_learning_rate", 5e-3),
    "optimizer.warmup_steps": _one("optimizer.warmup_steps", 5),
    "optimizer.clip_norm": _one("optimizer.clip_norm", 0.05),
    "optimizer.weight_decay": _one("optimizer.weight_decay", 5.0),
    "optimizer.b1": _one("optimizer.b1", 0.2),
    "optimizer.b2": _one("optimizer.b2", 0.5),
    "optimizer.eps": _one("optimizer.eps", 1.0),
    "optimizer.power": _one("optimizer.power", 3.0),
    "train.num_steps": _one("train.num_steps", 5),
    "train.on_nonfinite": _one("train.on_nonfinite", "halt", BLOWUP),
    "train.max_consecutive_skips": _one("train.max_consecutive_skips", 3, BLOWUP),
    "train.count_skipped_steps": _one("train.count_skipped_steps", False, SHORT),
    "optimizer.loss_scale.initial_scale": (FP16, HIGH),
    "optimizer.loss_scale.growth_interval": _one("optimizer.loss_scale.growth_interval", 2, FP16),
    "optimizer.loss_scale.min_scale": _one("optimizer.loss_scale.min_scale", 2.0**26, HIGH),
}


def _config(make_config, settings):
  config = make_config()
  config.optimizer.update(learning_rate=1e-2, warmup_steps=2, schedule="polynomial")
  config.train.update(num_steps=STEPS, batch_size=4)
  config_lib.apply_overrides(config, settings)
  return config


def _trajectory(configs, batch, one_at_a_time=None):
  """[K] dicts of [STEPS] arrays: what each run of one program of `configs` reported, its runs
  stepping as `one_at_a_time` says (None: as normstudy.engine.execution chooses)."""
  mesh = sharding.make_mesh(configs[0].mesh, jax.devices()[:1])
  steps = execution.ProgramSteps(configs[0], mesh, len(configs), one_at_a_time=one_at_a_time)
  state = steps.initial(configs)
  stacked = sharding.global_batch(mesh, {"tokens": np.stack([batch] * len(configs))})
  seen = []
  for _ in range(STEPS):
    state, metrics = steps.train(state, stacked)
    seen.append({key: np.asarray(metrics[key]) for key in OBSERVED})
  return [{key: np.array([s[key][k] for s in seen]) for key in OBSERVED}
          for k in range(len(configs))]


# Reports that are counts, flags or powers of two: equal in either stepping mode.
DISCRETE = ("skipped", "clipped", "status", "loss_scale")


def _same(a, b, exact: bool):
  """Every report equal: bit for bit when the program's runs step one at a time through the
  one-run program (normstudy.engine.execution); vmapped, the K-run program rounds the last bits
  differently, so the floats agree to rounding and the discrete reports exactly."""
  for key in OBSERVED:
    if exact or key in DISCRETE:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    else:
      np.testing.assert_allclose(a[key], b[key], rtol=2e-3, atol=1e-6, err_msg=key)


def test_every_per_run_field_has_a_scenario_and_is_a_config_field():
  assert set(SCENARIOS) == set(per_run.RUN_DATA_FIELDS)
  config = config_lib.default_config()
  for field in per_run.RUN_DATA_FIELDS:
    config_lib.get_field(config, field)  # a KeyError names a field the schema lacks


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one_at_a_time", "vmapped"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_each_run_of_a_program_trains_with_its_own_value(make_config, dtype, mode):
  # Every run of this dtype's scenarios in one program (all their other fields are per-run too),
  # built from the first run's config, against each run alone.
  fields = [f for f in sorted(SCENARIOS) if SCENARIOS[f][0].get("model.dtype", "float32") == dtype]
  settings = {}
  for field in fields:
    for one in SCENARIOS[field]:
      settings.setdefault(json.dumps(one, sort_keys=True), one)
  keys = list(settings)
  configs = [_config(make_config, one) for one in settings.values()]
  batch = np.random.default_rng(0).integers(0, 32, (4, 16)).astype(np.int32)
  one_at_a_time = mode == "one_at_a_time"
  together = _trajectory(configs, batch, one_at_a_time)
  alone = [_trajectory([config], batch)[0] for config in configs]
  for field in fields:
    a, b = (keys.index(json.dumps(one, sort_keys=True)) for one in SCENARIOS[field])
    assert any(not np.array_equal(alone[a][key], alone[b][key], equal_nan=True)
               for key in OBSERVED), f"{field}: the scenario changes nothing; it tests nothing"
    for k in (a, b):
      try:
        _same(together[k], alone[k], exact=one_at_a_time)
      except AssertionError as e:
        raise AssertionError(f"{field}: the run with {keys[k]} trained differently in a {mode} "
                             "program than alone") from e


def test_a_restored_state_takes_the_changeable_fields_of_its_new_config(make_config):
  config = make_config()
  state = jax.tree.map(np.asarray, per_run.run_values(config))
  changed = make_config()
  changed.optimizer.update(learning_rate=0.5, warmup_steps=7)
  changed.train.update(seed=9, num_steps=50, max_consecutive_skips=2)
  changed.optimizer.loss_scale.update(initial_scale=4.0, min_scale=0.25)
  restored = inprocess.create_train_state(config)
  applied = per_run.apply_to_restored(restored, per_run.run_values(changed))
  assert float(applied.hparams["learning_rate"]) == 0.5
  assert float(applied.hparams["warmup_steps"]) == 7
  assert int(applied.limits["num_steps"]) == 50 and int(applied.limits["max_consecutive_skips"]) == 2
  assert float(applied.loss_scale.min_scale) == 0.25
  # The seed, the initial scale and the schedule's horizon shape the run already trained.
  assert float(applied.hparams["schedule_steps"]) == float(state["hparams"]["schedule_steps"])
  assert float(applied.loss_scale.scale) == float(restored.loss_scale.scale)
  np.testing.assert_array_equal(applied.rng, restored.rng)
  assert int(applied.status) == life.CODE_RUNNING


@pytest.mark.slow
def test_a_stopped_run_is_not_stepped_again_and_reports_nothing(make_config):
  """Stepped one at a time, a run the loop says has stopped keeps its state object as it was
  (no compiled step ran for it) and reports itself inactive; the others step as ever."""
  configs = [_config(make_config, {"train.num_steps": 2}), _config(make_config, {})]
  mesh = sharding.make_mesh(configs[0].mesh, jax.devices()[:1])
  steps = execution.ProgramSteps(configs[0], mesh, 2, one_at_a_time=True)
  batch = sharding.global_batch(mesh, {"tokens": np.zeros((2, 4, 16), np.int32)})
  state = steps.initial(configs)
  for _ in range(2):  # run 0 finishes at step 2
    state, metrics = steps.step(state, batch, stopped=frozenset())
  assert int(np.asarray(metrics["status"])[0]) == life.CODE_FINISHED
  frozen = state[0]
  for _ in range(3):
    state, metrics = steps.step(state, batch, stopped=frozenset({0}))
    assert state[0] is frozen
    assert list(np.asarray(metrics["active"])) == [False, True]
  alone = execution.ProgramSteps(configs[1], mesh, 1)
  single = alone.initial([configs[1]])
  one_batch = sharding.global_batch(mesh, {"tokens": np.zeros((1, 4, 16), np.int32)})
  for _ in range(5):
    single, _ = alone.step(single, one_batch)
  np.testing.assert_array_equal(jax.tree.leaves(alone.stacked(single).params)[0],
                                jax.tree.leaves(steps.stacked(state).params)[0][1:])
