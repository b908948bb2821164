"""Device meshes and where every array lives on them: the one place the logical-axis rules are.

The mesh has three axes, sized by `config.mesh.{data,fsdp,tensor}` (one of them may be -1, the
remaining devices):
  data    replicas, each with a slice of the batch
  fsdp    a slice of the batch too, and a slice of every parameter and optimizer moment (on `embed`)
  tensor  attention heads and the MLP hidden dimension
Parameters carry logical axis names (normstudy.model); RULES map them to mesh axes. The train
step is `jax.jit` with these shardings on its inputs and outputs and the state donated.
"""

import math

import flax.linen as nn
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from normstudy import model as model_lib
from normstudy import steps as steps_lib
from normstudy.errors import UserError

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis -> mesh axis (None: replicated)
RULES = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("kv", None),
    ("vocab", None),
    ("layers", None),
)


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) sizes, with a -1 resolved; UserError if they do not fit the devices."""
  sizes = [int(mesh_cfg.get(axis, 1)) for axis in AXES]
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
  return tuple(sizes)


def make_mesh(mesh_cfg, devices=None) -> jax.sharding.Mesh:
  """A mesh over `devices` (default: all). Auto axis types: jax.make_mesh now defaults to
  Explicit, under which matmuls with sharded contracting dimensions fail (jax 0.10)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_cfg, len(devices))
  return jax.sharding.Mesh(np.asarray(devices).reshape(shape), AXES)


def check_divisible(config, sizes: dict) -> None:
  """UserError naming the first model or batch size that a mesh of `sizes` (axis -> size)
  cannot split evenly."""
  m = config.model
  need = [
      ("config.train.batch_size", config.train.batch_size, sizes["data"] * sizes["fsdp"],
       "data x fsdp"),
      ("config.model.d_model", m.d_model, sizes["fsdp"], "fsdp"),
      ("config.model.num_heads", m.num_heads, sizes["tensor"], "tensor"),
      ("config.model.d_ff", m.d_ff, sizes["tensor"], "tensor"),
  ]
  for field, value, parts, axes in need:
    if value % parts:
      raise UserError(f"{field}={value} is not divisible by the mesh's {axes} size {parts} "
                      f"(mesh data={sizes['data']}, fsdp={sizes['fsdp']}, "
                      f"tensor={sizes['tensor']})")


def batch_sharding(mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _boxed_state(config):
  cfg = model_lib.ModelConfig.create(config.model)
  params = model_lib.boxed_init(cfg)(jax.random.PRNGKey(config.train.seed))
  return steps_lib.create_train_state(config, params=params)


def state_shardings(config, mesh):
  """NamedShardings of every leaf of the (unboxed) train state."""
  specs = nn.get_partition_spec(jax.eval_shape(lambda: _boxed_state(config)))
  return nn.logical_to_mesh_sharding(specs, mesh, RULES)


def create_state(config, mesh):
  """The initial train state, created directly in its shards (same values as on one device)."""
  shardings = state_shardings(config, mesh)
  with jax.set_mesh(mesh):
    return jax.jit(lambda: nn.unbox(_boxed_state(config)), out_shardings=shardings)(), shardings


def jit_train_step(config, mesh, shardings, telemetry: bool = False):
  """The train step compiled for the mesh: sharded state in and out (donated), batch split."""
  step = steps_lib.make_train_step(config, telemetry=telemetry)
  return jax.jit(step, in_shardings=(shardings, batch_sharding(mesh)),
                 out_shardings=(shardings, replicated(mesh)), donate_argnums=0)


def jit_eval_step(config, mesh, shardings):
  return jax.jit(steps_lib.make_eval_step(config),
                 in_shardings=(shardings.params, batch_sharding(mesh)),
                 out_shardings=replicated(mesh))


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
  """Device arrays of the global batch, from this process's rows of it."""
  sharding = batch_sharding(mesh)
  if jax.process_count() == 1:
    return jax.device_put(local_batch, sharding)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch)
