"""What the compiler a program is built for asks of normstudy: every XLA:CPU-only choice, made
in one place from the devices the program is compiled for.

Asked of those devices, never of `jax.default_backend()`: a CPU host compiling for TPU devices
ahead of time (normstudy.compile) must choose as the TPU does, and the host's backend is "cpu"
there (../shared/notes/stack-facts.md). The measurements behind each choice are in the
benchmarks each field names; docs/throughput.md reports them.

Not here, on purpose: whether the layer stack is scanned (normstudy.core.model.scans, a rule
measured on XLA:CPU when `model.scan_layers` is unset). It decides the parameters' tree
(stacked `layers` or `layer_<i>`), so it must be a function of the config alone: a run started
on one platform then restores its checkpoints on any other. Set `model.scan_layers=True` on a
pod to scan whatever the rule says (it compiles a deep stack once).
"""

import dataclasses

from normstudy.errors import UserError

# XLA:CPU removes optimization barriers before fusion (its `cse_barrier_expander` pass), which
# would undo the model's fusion boundaries; with the pass off they stay as no-ops that end
# fusions. Eigen's dots beat XNNPACK/YNN's at the small sizes normstudy trains on a CPU
# (benchmarks/trees.py step, benchmarks/throughput.py profile), so both are off.
CPU_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "cse_barrier_expander",
                        "xla_cpu_experimental_ynn_fusion_type": "", "xla_cpu_use_xnnpack": False}


@dataclasses.dataclass(frozen=True)
class Choices:
  """What a program compiled for some devices does differently on XLA:CPU.

  fusion_boundaries  the model ends fusions at each projection, the embedding plus positions,
                     the logits and each block (normstudy.core.layers.fusion_boundary), and
                     takes the operand layouts measured faster there: q, k, v projected
                     token-major, the MLP's layers.widening_product (`benchmarks/
                     throughput.py profile`; the same bits, `benchmarks/trees.py bits`)
  compiler_options   XLA options of every compiled step
  runs_one_at_a_time a program's K runs, with the runs axis unsplit, step one after another
                     through the one-run program rather than as one vmapped program, so each
                     run is bit for bit the run alone (normstudy.engine.execution;
                     benchmarks/grids.py)
  worker_processes   a sweep may train programs side by side in worker processes, one per
                     share of the cores (normstudy.experiments.workers; benchmarks/grids.py workers)
  """
  fusion_boundaries: bool
  compiler_options: dict
  runs_one_at_a_time: bool
  worker_processes: bool


def choices(devices) -> Choices:
  """The choices for a program compiled for `devices` (any iterable of JAX devices, concrete
  or from a topology description)."""
  cpu = next(iter(devices)).platform == "cpu"
  return Choices(fusion_boundaries=cpu, compiler_options=dict(CPU_COMPILER_OPTIONS) if cpu else {},
                 runs_one_at_a_time=cpu, worker_processes=cpu)


def check_kernels(config, devices) -> None:
  """UserError, before anything is written, when `config` asks for a kernel that `devices` (any
  iterable of JAX devices, concrete or from a topology description) do not have:
  model.attention_kernel='cudnn' needs a GPU, and a head dimension cuDNN's fused kernel takes (a
  multiple of 8, at most 256 on Hopper and later, compute capability 9.0, else 128: jax's
  fused_attention_stablehlo.check_is_flash_attention, which would otherwise fail inside the
  trace)."""
  model = config.model
  if model.attention_kernel != "cudnn":
    return
  device = next(iter(devices))
  if device.platform != "gpu":
    raise UserError(f"config.model.attention_kernel='cudnn' needs a GPU; these devices are "
                    f"{device.platform}; allowed here: 'xla'")
  head_dim = model.d_model // model.num_heads
  capability = getattr(device, "compute_capability", "0")
  largest = 256 if tuple(int(x) for x in str(capability).split(".")[:2]) >= (9, 0) else 128
  if head_dim % 8 or head_dim > largest:
    raise UserError(
        f"config.model.attention_kernel='cudnn' takes a head dimension that is a multiple of 8 "
        f"and at most {largest} on this GPU (compute capability {capability}); "
        f"config.model.d_model={model.d_model} / num_heads={model.num_heads} is {head_dim}; "
        "allowed: other heads, or attention_kernel='xla'")
