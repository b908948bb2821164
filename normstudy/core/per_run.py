"""What the K runs of one program may differ in, and what a continued run may change, declared
once.

A run's per-run values are data in its train state, so one compiled step serves K runs stacked on
a leading axis (normstudy.engine.sharding). `FIELDS` below is the only list of them: the values a
config gives (`run_values`), their stack over K runs (`stacked_values`), the config fields that
may differ within a program (`RUN_DATA_FIELDS`, which normstudy.experiments.planning leaves out
of the program key) and what a changed config applies to a restored state (`apply_to_restored`)
all derive from it. The compiled step must read these values from the state, never from the
config: the config it is built from is the first run's (tests/test_per_run.py trains each field
two ways in one program against each run alone). Beside them, CHANGEABLE_FIELDS: what a run
continued from its checkpoint may change without --allow_config_change (`config_differences`).
"""

import dataclasses
import json
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from normstudy.core import config as config_lib
from normstudy.core import fields
from normstudy.records import rundir

GROUPS = ("seed", "hparams", "limits", "loss_scale")


@dataclasses.dataclass(frozen=True)
class RunField:
  """One per-run value: where it lives in the run values (`group`, `key`), the config field it
  comes from (None: derived from others), its dtype, how a config gives it, and whether a changed
  config applies it to a restored run (`on_restore`; the seed and the initial loss scale only
  shape the initial state, and a schedule keeps the horizon its run started with)."""
  group: str
  key: str
  field: str | None
  dtype: Any
  read: Callable
  on_restore: bool = True


def _field(dotted):
  return lambda config: fields.get_field(config, dotted)


def _optimizer(key, dtype=jnp.float32, read=None):
  return RunField("hparams", key, f"optimizer.{key}", dtype, read or _field(f"optimizer.{key}"))


FIELDS = (
    RunField("seed", "seed", "train.seed", jnp.int32, _field("train.seed"), on_restore=False),
    _optimizer("learning_rate"),
    _optimizer("end_learning_rate"),
    _optimizer("warmup_steps"),
    # Where the schedule's decay ends: the run's num_steps when it starts, kept on a resume.
    RunField("hparams", "schedule_steps", None, jnp.float32, _field("train.num_steps"),
             on_restore=False),
    _optimizer("clip_norm", read=lambda c: c.optimizer.clip_norm or 0.0),  # None, 0: no clip
    _optimizer("weight_decay"),
    _optimizer("b1"),
    _optimizer("b2"),
    _optimizer("eps"),
    _optimizer("power"),
    RunField("limits", "num_steps", "train.num_steps", jnp.int32, _field("train.num_steps")),
    RunField("limits", "count_skipped_steps", "train.count_skipped_steps", bool,
             _field("train.count_skipped_steps")),
    RunField("limits", "halt_on_nonfinite", "train.on_nonfinite", bool,
             lambda c: c.train.on_nonfinite == "halt"),
    RunField("limits", "max_consecutive_skips", "train.max_consecutive_skips", jnp.int32,
             _field("train.max_consecutive_skips")),
    RunField("loss_scale", "initial_scale", "optimizer.loss_scale.initial_scale", jnp.float32,
             _field("optimizer.loss_scale.initial_scale"), on_restore=False),
    RunField("loss_scale", "growth_interval", "optimizer.loss_scale.growth_interval", jnp.int32,
             _field("optimizer.loss_scale.growth_interval")),
    RunField("loss_scale", "min_scale", "optimizer.loss_scale.min_scale", jnp.float32,
             _field("optimizer.loss_scale.min_scale")),
)

# Config fields that are data in the state, so they may differ between the runs of one program.
RUN_DATA_FIELDS = tuple(dict.fromkeys(f.field for f in FIELDS if f.field is not None))


def program_key(config) -> str:
  """What must be equal for runs to share one compiled program: the config without its per-run
  fields (RUN_DATA_FIELDS) and label. normstudy.experiments.planning groups a grid's runs into
  programs by it, and normstudy.engine.execution keeps a process's compiled steps under it."""
  flat = rundir.flatten(rundir.config_json(config))
  for field in RUN_DATA_FIELDS + ("label",):
    flat.pop(field, None)
  return json.dumps(flat, sort_keys=True, default=str)


# Config fields a continued run may change: they do not alter the trajectory already recorded (the
# mesh included: a checkpoint restores onto any layout, and results do not depend on it).
# num_steps may grow; the learning-rate schedule stays the one the run started with
# (docs/reference.md, "Reliability": continuing a run). Of the per-run fields, the limits a
# restored state takes from its config (on_restore) that bound the run rather than shape it.
CHANGEABLE_FIELDS = (
    "label", "data.data_dir", "mesh.runs", "mesh.data", "mesh.fsdp", "mesh.tensor",
    "train.num_steps", "train.log_every", "train.eval_every",
    "train.checkpoint_every", "train.max_to_keep", "train.on_nonfinite",
    "train.max_consecutive_skips", "train.telemetry_every", "train.tensorboard",
    "train.wandb_project", "train.steps_per_dispatch",
)


def config_differences(old: dict, new: dict, changeable=CHANGEABLE_FIELDS) -> list[str]:
  """'field: old -> new' for every field of two config.json objects that differs and may not
  change between sessions. A field the saved config lacks (it was written before the field
  existed) differs only if the new value is not what such a run did: the field's default, or
  what its declaration says runs from before it behaved as (Field.before)."""
  old_flat, new_flat = rundir.flatten(old), rundir.flatten(new)
  defaults = {f.name: f.before if f.has_before else f.default for f in config_lib.FIELDS}
  return [f"{k}: {old_flat.get(k, '<absent>')!r} -> {new_flat.get(k, '<absent>')!r}"
          for k in sorted(set(old_flat) | set(new_flat))
          if old_flat.get(k) != new_flat.get(k) and k not in changeable
          and not (k not in old_flat and k in defaults and new_flat.get(k) == defaults[k])]


def run_values(config, schedule_steps=None) -> dict:
  """A run's per-run values as scalars: {"seed": int32, "hparams": {...}, "limits": {...},
  "loss_scale": {...}}. `schedule_steps`: the schedule's horizon if not the config's num_steps
  (a resumed run keeps its own)."""
  values = {}
  for f in FIELDS:
    value = f.read(config)
    if f.key == "schedule_steps" and schedule_steps is not None:
      value = schedule_steps
    value = jnp.asarray(value, f.dtype)
    if f.group == f.key:
      values[f.group] = value
    else:
      values.setdefault(f.group, {})[f.key] = value
  return values


def stacked_values(configs, schedule_steps=None) -> dict:
  """The runs' `run_values`, stacked as numpy arrays: every leaf [K]. `schedule_steps`: [K]."""
  per_run = [jax.tree.map(np.asarray, run_values(
      c, None if schedule_steps is None else schedule_steps[k])) for k, c in enumerate(configs)]
  return jax.tree.map(lambda *xs: np.stack(xs), *per_run)


def apply_to_restored(state, values: dict):
  """`state` (stacked or not) with the `on_restore` fields of `values` (as `run_values` or
  `stacked_values` give them) replacing its own: a continued run takes its config's new
  hyperparameters, limits and loss-scale settings, not a new seed, initial scale or horizon."""
  updates = {group: {} for group in GROUPS}
  for f in FIELDS:
    if f.on_restore:
      updates[f.group][f.key] = values[f.group][f.key]
  return state.replace(hparams={**state.hparams, **updates["hparams"]},
                       limits={**state.limits, **updates["limits"]},
                       loss_scale=state.loss_scale.replace(**updates["loss_scale"]))
