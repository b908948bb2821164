"""Device meshes and where every array lives on them: the one place the logical-axis rules are.

The mesh has four axes, sized by `config.mesh.{runs,data,fsdp,tensor}` (one of them may be -1,
the remaining devices):
  runs    the K runs of one program (a sweep), each run on its own slice of devices
  data    replicas, each with a slice of the batch
  fsdp    a slice of the batch too, and a slice of every parameter and optimizer moment (on `embed`)
  tensor  attention heads and the MLP hidden dimension
Every state leaf carries a leading run axis of size K (K = 1 for a single run). Parameters carry
logical axis names (normstudy.model); RULES map them to mesh axes. The steps are `jax.jit` of
`jax.vmap` over the run axis, with these shardings on inputs and outputs and the state donated;
on XLA:CPU with the runs axis unsplit, K runs step one after another through the one-run program
instead (`one_at_a_time`), so that each run of a sweep is bit for bit the run alone.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from normstudy import model as model_lib
from normstudy import per_run
from normstudy import steps as steps_lib
from normstudy.errors import UserError

AXES = ("runs", "data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis -> mesh axis (None: replicated)
RULES = (
    ("runs", "runs"),
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("kv", None),
    ("vocab", None),
    ("layers", None),
)


def mesh_shape(mesh_cfg, num_devices: int) -> dict:
  """{axis: size} with a -1 resolved; UserError if the sizes do not fit the devices."""
  sizes = [int(mesh_cfg[axis]) for axis in AXES]
  described = ", ".join(f"config.mesh.{a}={s}" for a, s in zip(AXES, sizes))
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise UserError(f"{described}: each size must be >= 1, and at most one may be -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise UserError(f"{described}: the other axes ({known}) do not divide the {num_devices} "
                      "devices")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise UserError(f"{described}: the mesh has {math.prod(sizes)} devices, but there are "
                    f"{num_devices}")
  return dict(zip(AXES, sizes))


def make_mesh(mesh_cfg, devices=None) -> jax.sharding.Mesh:
  """A mesh over `devices` (default: all). Auto axis types: jax.make_mesh now defaults to
  Explicit, under which matmuls with sharded contracting dimensions fail (jax 0.10)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = tuple(mesh_shape(mesh_cfg, len(devices)).values())
  return jax.sharding.Mesh(np.asarray(devices).reshape(shape), AXES)


def check_divisible(config, sizes: dict, num_runs: int = 1) -> None:
  """The one check that a mesh of `sizes` (axis -> size) splits every sharded size evenly:
  UserError naming the first that it does not."""
  m = config.model
  need = [
      (f"{num_runs} runs", num_runs, sizes["runs"], "runs"),
      (f"config.train.batch_size={config.train.batch_size}", config.train.batch_size,
       sizes["data"] * sizes["fsdp"], "data x fsdp"),
      (f"config.model.d_model={m.d_model}", m.d_model, sizes["fsdp"], "fsdp"),
      (f"config.model.num_heads={m.num_heads}", m.num_heads, sizes["tensor"], "tensor"),
      (f"config.model.d_ff={m.d_ff}", m.d_ff, sizes["tensor"], "tensor"),
  ]
  for what, value, parts, axes in need:
    if value % parts:
      mesh = ", ".join(f"{a}={s}" for a, s in sizes.items())
      raise UserError(f"{what} is not divisible by the mesh's {axes} size {parts} (mesh {mesh})")


def batch_sharding(mesh) -> NamedSharding:
  """[runs, batch, ...] arrays: runs on `runs`, the batch on data x fsdp."""
  return NamedSharding(mesh, P("runs", BATCH_AXES))


def runs_sharding(mesh) -> NamedSharding:
  """[runs, ...] per-run values (metrics, seeds, hyperparameters)."""
  return NamedSharding(mesh, P("runs"))


def _one_run_state(config, values, boxed: bool):
  # Unboxed without sharding constraints: the jit's out_shardings place the arrays.
  state = steps_lib.init_state(config, values)
  return state if boxed else steps_lib.unboxed(state)


def state_shardings(config, mesh):
  """NamedShardings of every leaf of the stacked (unboxed) train state [K, ...]."""
  values = jax.tree.map(np.asarray, per_run.run_values(config))
  boxed = jax.eval_shape(lambda: _one_run_state(config, values, boxed=True))
  specs = nn.get_partition_spec(boxed)
  stacked = jax.tree.map(lambda spec: P("runs", *spec), specs,
                         is_leaf=lambda x: isinstance(x, P))
  return jax.tree.map(lambda spec: NamedSharding(mesh, nn.logical_to_mesh_axes(spec, RULES)),
                      stacked, is_leaf=lambda x: isinstance(x, P))


def create_states(configs, mesh):
  """The stacked initial state of runs whose configs share a program (same values as each run
  alone on one device), created directly in its shards; returns (state, shardings)."""
  config = configs[0]
  shardings = state_shardings(config, mesh)
  init = jax.jit(jax.vmap(lambda values: _one_run_state(config, values, boxed=False)),
                 out_shardings=shardings)
  with jax.set_mesh(mesh):
    if one_at_a_time(mesh, len(configs)):  # each run from the one-run program, as alone
      state = stacked_state([init(per_run.stacked_values([c])) for c in configs], shardings)
    else:
      state = init(per_run.stacked_values(configs))
  return state, shardings


def one_at_a_time(mesh, num_runs: int) -> bool:
  """Whether a program's `num_runs` stacked runs step one after another through the compiled
  one-run program (the one normstudy.main runs) rather than as one vmapped K-run program: on
  XLA:CPU with the runs axis unsplit. There a vmapped program is little faster per run-step
  (benchmarks/sweep.py, jaxlib 0.10.2: 1.06-1.15x at the seed size, 0.9-1.1x at S) and rounds
  the last bits differently from the one-run program, while one after another every run of a
  sweep computes bit for bit what it computes alone, and its sweep.json command reproduces it.
  On accelerators stacking is the speed: vmapped."""
  return (num_runs > 1 and mesh.shape["runs"] == 1
          and mesh.devices.flat[0].platform == "cpu")


def _join(parts):
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


def _take(tree, k):
  return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, k, 1), tree)


def per_run_states(state, shardings, num_runs: int) -> list:
  """The stacked state [K, ...] as K one-run states [1, ...]: how one_at_a_time steps hold a
  program's runs between steps (each run's state donated to and returned by its own step, so no
  stacked copy is made per step)."""
  take = jax.jit(_take, out_shardings=shardings)
  return [take(state, k) for k in range(num_runs)]


def stepping_state(state, shardings, mesh, num_runs: int, vmapped=None):
  """The stacked state as the steps of jit_train_step(..., num_runs, vmapped) take it:
  per_run_states when its runs step one at a time, else the state itself."""
  if _looped(mesh, num_runs, vmapped):
    return per_run_states(state, shardings, num_runs)
  return state


def _looped(mesh, num_runs: int, vmapped) -> bool:
  if vmapped is not None:
    return num_runs > 1 and not vmapped
  return one_at_a_time(mesh, num_runs)


def stacked_state(state, shardings):
  """The stacked state [K, ...] of `state`, stacked or per_run_states (a copy then: for
  checkpoints)."""
  if not isinstance(state, list):
    return state
  return jax.jit(_join, out_shardings=shardings)(state)


def params_of(state):
  """The parameters of a stacked state, or the list of each run's for per_run_states."""
  return [s.params for s in state] if isinstance(state, list) else state.params


def _run_by_run(one_run, batch_sharding_, updates_first: bool):
  """fn(firsts, batch) for K runs held as a list of one-run values `firsts` ([1, ...] each, as
  per_run_states) and the stacked batch: K calls of `one_run` (the jitted one-run program),
  their outputs joined on the run axis. `updates_first`: one_run returns (new first, outputs)
  and fn returns (the list of new firsts, joined outputs)."""
  take_batch = jax.jit(_take, out_shardings=batch_sharding_)
  join = jax.jit(_join)

  def step(firsts, batch):
    outs = [one_run(first, take_batch(batch, k)) for k, first in enumerate(firsts)]
    if updates_first:
      return [out[0] for out in outs], join([out[1] for out in outs])
    return join(outs)

  return step


def over_runs(fn, num_runs: int):
  """`fn` of one run, applied to K runs stacked on a leading axis: vmapped for K > 1; for one
  run the axis is squeezed away and restored around `fn` itself (a reshape, free), since a
  vmapped step of one run cost 18% at the benchmark's size S on XLA:CPU (jax 0.10)."""
  if num_runs > 1:
    return jax.vmap(fn, spmd_axis_name="runs")

  def one_run(*args):
    out = fn(*jax.tree.map(lambda x: x[0], args))
    return jax.tree.map(lambda x: x[None], out)

  return one_run


# XLA:CPU options, measured with benchmarks/ab.py and benchmarks/profile.py (jaxlib 0.10.2):
# - XLA:CPU removes optimization barriers before fusion (its `cse_barrier_expander` pass), which
#   would undo model.fusion_boundary; with the pass off they stay as no-ops that end fusions.
#   Other backends keep barriers through fusion already.
# - With the boundaries in place, dots through Eigen are as fast as through XNNPACK/YNN at size M
#   and 1.1-1.2x faster at S and at the seed figure's size (small dots, where YNN's per-call
#   cost dominates), so YNN fusion and XNNPACK are off.
CPU_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "cse_barrier_expander",
                        "xla_cpu_experimental_ynn_fusion_type": "", "xla_cpu_use_xnnpack": False}


def compiler_options(mesh) -> dict:
  """XLA options for the steps compiled on `mesh`'s devices."""
  return dict(CPU_COMPILER_OPTIONS) if mesh.devices.flat[0].platform == "cpu" else {}


def _jit_steps(fn, mesh, first_sharding, num_runs: int, updates_first: bool, vmapped=None):
  """fn(first, batch) of one run, compiled for K stacked runs on the mesh: one vmapped program
  on the stacked `first`, or (`vmapped` False; None: one_at_a_time decides) the one-run
  program called per run on the list of per_run_states. `updates_first`: fn returns (new
  first, metrics) and `first` (the state) is donated."""
  outputs = runs_sharding(mesh)
  looped = _looped(mesh, num_runs, vmapped)
  step = jax.jit(over_runs(fn, 1 if looped else num_runs),
                 in_shardings=(first_sharding, batch_sharding(mesh)),
                 out_shardings=(first_sharding, outputs) if updates_first else outputs,
                 donate_argnums=0 if updates_first else (),
                 compiler_options=compiler_options(mesh))
  if looped:
    return _run_by_run(step, batch_sharding(mesh), updates_first)
  return step


def jit_train_step(config, mesh, shardings, num_runs: int, telemetry_on: bool = False,
                   vmapped=None):
  """The train step of `num_runs` stacked runs, compiled for the mesh: state donated.
  `vmapped`: True or False to choose how K runs step (benchmarks); None: `one_at_a_time`."""
  return _jit_steps(steps_lib.make_train_step(config, telemetry_on), mesh, shardings, num_runs,
                    updates_first=True, vmapped=vmapped)


def jit_eval_step(config, mesh, shardings, num_runs: int):
  return _jit_steps(steps_lib.make_eval_step(config), mesh, shardings.params, num_runs,
                    updates_first=False)


def jit_locate_step(config, mesh, shardings, num_runs: int):
  return _jit_steps(steps_lib.make_locate_step(config), mesh, shardings, num_runs,
                    updates_first=False)


def initialize_distributed(coordinator_address=None, num_processes=None, process_id=None):
  """jax.distributed.initialize for multi-process runs.

  Explicit flags win; with none, a TPU pod or a multi-task SLURM job is detected and JAX's
  automatic configuration used; otherwise this is a single-process run and nothing happens.
  """
  import os
  explicit = [v is not None for v in (coordinator_address, num_processes, process_id)]
  if any(explicit):
    if not all(explicit):
      raise UserError("--coordinator_address, --num_processes and --process_id go together")
    if not 0 <= process_id < num_processes:
      raise UserError(f"--process_id={process_id} is outside [0, --num_processes="
                      f"{num_processes})")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return True
  on_slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1
  on_tpu_pod = "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if on_slurm or on_tpu_pod:
    jax.distributed.initialize()
    return True
  return False


def global_batch(mesh, local_batch: dict) -> dict:
  """Device arrays of the global batch [runs, batch, ...], from this process's rows of it."""
  sharding = batch_sharding(mesh)
  if jax.process_count() == 1:
    return jax.device_put(local_batch, sharding)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch)
