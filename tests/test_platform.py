"""normstudy.engine.platform decides every XLA:CPU-only choice from the devices a program is
compiled for, and the steps carry its choice: a CPU host compiling for other devices must not get
the CPU's fusion boundaries, compiler options or stepping."""

import dataclasses

import jax
import numpy as np
import pytest

from normstudy.core import steps as steps_lib
from normstudy.engine import execution
from normstudy.engine import platform
from normstudy.engine import sharding
import inprocess
import runs


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


@dataclasses.dataclass
class _Gpu:
  compute_capability: str
  platform: str = "gpu"


@pytest.mark.parametrize("devices,heads,refusal", [
    ([_Device("cpu")], 4, "needs a GPU; these devices are cpu; allowed here: 'xla'"),
    ([_Device("tpu")], 4, "needs a GPU; these devices are tpu"),
    ([_Gpu("9.0")], 4, None),  # head dimension 32
    ([_Gpu("8.0")], 1, None),  # 128: every GPU's limit
    ([_Gpu("9.0")], 1, None),
    ([_Gpu("8.0")], 64, "a multiple of 8 and at most 128 on this GPU (compute capability 8.0); "
     "config.model.d_model=128 / num_heads=64 is 2"),
    ([_Gpu("9.0")], 32, "is 4"),
])
def test_the_fused_kernel_is_refused_where_cudnn_cannot_run_it(make_config, devices, heads,
                                                              refusal):
  """model.attention_kernel='cudnn' on a GPU with a head dimension cuDNN's fused kernel takes
  (jax's check_is_flash_attention: a multiple of 8, at most 256 from Hopper on, else 128), in
  one line before anything is written, rather than a traceback from inside the trace."""
  from normstudy import errors
  config = make_config(attention_kernel="cudnn", dtype="bfloat16", d_model=128, num_heads=heads)
  if refusal is None:
    platform.check_kernels(config, devices)
  else:
    with pytest.raises(errors.UserError) as e:
      platform.check_kernels(config, devices)
    assert refusal in str(e.value) and "\n" not in str(e.value)


def test_the_fused_kernel_takes_256_wide_heads_from_hopper_on(make_config):
  from normstudy import errors
  wide = make_config(attention_kernel="cudnn", dtype="bfloat16", d_model=256, num_heads=1)
  platform.check_kernels(wide, [_Gpu("9.0")])
  platform.check_kernels(wide, [_Gpu("10.0")])
  with pytest.raises(errors.UserError, match="at most 128 on this GPU"):
    platform.check_kernels(wide, [_Gpu("8.6")])
  platform.check_kernels(make_config(d_model=128, num_heads=64), [_Device("cpu")])  # xla: any


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


def _gpu_benchmark():
  return runs.benchmark("gpu")


def test_the_gpu_benchmark_fills_the_card_and_halves_the_batch_until_it_fits(monkeypatch):
  """The 125M LM at 256 x 1024 tokens a step (issue 44: 16 x 1024 left an H100 idle), each
  block recomputed; on an out-of-memory error the rows halve, and the rows used are recorded."""
  gpu = _gpu_benchmark()
  config = gpu.gpt_125m()
  assert config.train.batch_size * config.model.max_len >= 256 * 1024
  assert config.model.remat == "block"
  tried = []

  def timed(config, steps):
    tried.append(config.train.batch_size)
    if config.train.batch_size > 64:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
    return {"tokens_per_s": 1.0}

  monkeypatch.setattr(gpu, "timed", timed)
  row = gpu.timed_fitting(gpu.gpt_125m, gpu.GPT_ROWS, 3)
  assert tried == [256, 128, 64] and row["rows"] == 64 and row["tokens_per_step"] == 64 * 1024
  monkeypatch.setattr(gpu, "timed", lambda c, s: (_ for _ in ()).throw(KeyError("bug")))
  with pytest.raises(KeyError):
    gpu.timed_fitting(gpu.gpt_125m, gpu.GPT_ROWS, 3)


def test_the_gpu_benchmark_knows_a_peak_only_for_the_card_it_names():
  """Whole tokens of jax's device_kind: "L4" is not "L40S", an H100 PCIe card is not an SXM
  one (issue 44: substring matching once gave both the wrong peak)."""
  gpu = _gpu_benchmark()
  expected = {"NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H100 PCIe": 756.0, "NVIDIA H100 NVL": 835.0,
              "NVIDIA L4": 121.0, "NVIDIA L40S": 362.0, "NVIDIA A100-SXM4-80GB": 312.0,
              "NVIDIA H200": 989.0, "NVIDIA A10G": None, "Tesla T4": None}
  assert {kind: gpu.peak_tflops(kind) for kind in expected} == expected
