"""normstudy.engine.platform decides every XLA:CPU-only choice from the devices a program is
compiled for, and the steps carry its choice: a CPU host compiling for other devices must not get
the CPU's fusion boundaries, compiler options or stepping."""

import dataclasses

import jax
import numpy as np

from normstudy.core import steps as steps_lib
from normstudy.engine import execution
from normstudy.engine import platform
from normstudy.engine import sharding
import inprocess


@dataclasses.dataclass
class _Device:
  platform: str


def test_the_choices_follow_the_devices_not_the_host():
  cpu = platform.choices(jax.devices())
  assert jax.devices()[0].platform == "cpu"
  assert cpu == platform.Choices(fusion_boundaries=True,
                                 compiler_options=platform.CPU_COMPILER_OPTIONS,
                                 runs_one_at_a_time=True, worker_processes=True)
  for name in ("tpu", "gpu"):
    assert platform.choices([_Device(name)] * 4) == platform.Choices(
        fusion_boundaries=False, compiler_options={}, runs_one_at_a_time=False,
        worker_processes=False), name


def _barriers(config, fusion_boundaries):
  """Optimization barriers in the lowered eval step (the train step's forward, cheaper to
  lower; the train step builds its model the same way, from steps._model_config)."""
  params = inprocess.create_train_state(config).params
  batch = {"tokens": np.zeros((config.train.batch_size, config.model.max_len), np.int32)}
  step = jax.jit(steps_lib.make_eval_step(config, fusion_boundaries=fusion_boundaries))
  return step.lower(params, batch).as_text().count("optimization_barrier")


def test_the_steps_carry_the_fusion_boundaries_only_when_asked(make_config):
  config = make_config()
  assert _barriers(config, False) == 0
  assert _barriers(config, True) > 0


def test_a_program_steps_its_runs_as_the_platform_or_the_caller_says(make_config):
  config = make_config()
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  assert execution.ProgramSteps(config, mesh, 3).one_at_a_time  # the CPU, runs axis unsplit
  assert not execution.ProgramSteps(config, mesh, 1).one_at_a_time  # one run: nothing to loop
  assert not execution.ProgramSteps(config, mesh, 3, one_at_a_time=False).one_at_a_time
