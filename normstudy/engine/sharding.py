"""Device meshes and where every array lives on them: the logical-axis rules, the shardings of
the state and the batch, the global batch, and multi-process start-up.

The mesh has four axes, sized by `config.mesh.{runs,data,fsdp,tensor}` (one of them may be -1,
the remaining devices):
  runs    the K runs of one program (a sweep), each run on its own slice of devices
  data    replicas, each with a slice of the batch
  fsdp    a slice of the batch too, and a slice of every parameter and optimizer moment (on `embed`)
  tensor  attention heads and the MLP hidden dimension
Every state leaf carries a leading run axis of size K (K = 1 for a single run). Parameters carry
logical axis names (normstudy.core.model); RULES map them to mesh axes. How a program's steps are
compiled with these shardings, and how its K runs step, is normstudy.engine.execution's.
"""

import math

import flax.linen as nn
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from normstudy.core import per_run
from normstudy.core import steps as steps_lib
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
    # activations (normstudy.core.layers.constrain): the batch as above, the rest replicated
    ("length", None),
    ("kv_length", None),
    ("act_embed", None),
    ("act_vocab", None),
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
      fixed = " x ".join(f"{a}={s}" for a, s in zip(AXES, sizes) if s != -1)
      raise UserError(f"{described}: {fixed} asks for {known} devices (or a multiple) and "
                      f"there {'is' if num_devices == 1 else 'are'} {num_devices}; allowed: "
                      f"sizes whose product divides {num_devices}")
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


def block_sharding(mesh) -> NamedSharding:
  """[runs, steps, batch, ...] arrays (a block of steps' batches): as batch_sharding, each
  run's steps together."""
  return NamedSharding(mesh, P("runs", None, BATCH_AXES))


def runs_sharding(mesh) -> NamedSharding:
  """[runs, ...] per-run values (metrics, seeds, hyperparameters)."""
  return NamedSharding(mesh, P("runs"))


def state_shardings(config, mesh):
  """NamedShardings of every leaf of the stacked (unboxed) train state [K, ...]."""
  values = jax.tree.map(np.asarray, per_run.run_values(config))
  boxed = jax.eval_shape(lambda: steps_lib.init_state(config, values))
  specs = nn.get_partition_spec(boxed)
  stacked = jax.tree.map(lambda spec: P("runs", *spec), specs,
                         is_leaf=lambda x: isinstance(x, P))
  return jax.tree.map(lambda spec: NamedSharding(mesh, nn.logical_to_mesh_axes(spec, RULES)),
                      stacked, is_leaf=lambda x: isinstance(x, P))


def initialize_distributed(coordinator_address=None, num_processes=None, process_id=None):
  """jax.distributed.initialize for multi-process runs.

  Explicit flags win; with none, a TPU pod (launch/tpu_pod.sh's NORMSTUDY_TPU_POD, GKE's
  worker list), a multi-task SLURM job or any multi-process cluster JAX's own detection finds
  (detected_cluster) uses JAX's automatic configuration; otherwise this is a single-process run
  and nothing happens.
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
                               num_processes=num_processes, process_id=process_id,
                               **_local_devices())
    return True
  on_slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1
  if on_slurm and "SLURM_STEP_NODELIST" not in os.environ:
    # sbatch --ntasks=N runs its script once; the N tasks exist only inside an srun step.
    raise UserError(f"this SLURM job has {os.environ['SLURM_NTASKS']} tasks but this process "
                    "runs outside an srun step (SLURM_STEP_NODELIST is unset): start each task "
                    "with srun (launch/slurm_gpu.sh does), or ask for one task")
  # GKE sets the worker list; launch/tpu_pod.sh says so on a TPU VM, whose workers JAX reads
  # from the metadata server.
  on_tpu_pod = ("," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
                or os.environ.get("NORMSTUDY_TPU_POD") == "1")
  if on_slurm or on_tpu_pod or detected_cluster() is not None:
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR_SHARED"):
      # JAX reads and writes its persistent cache on process 0 alone: a resumed job's process 0
      # loads its programs at once while the others compile them, past the rendezvous's
      # deadline. Off, every process compiles and they start together; a user whose cache
      # directory every process shares says so with JAX_COMPILATION_CACHE_DIR_SHARED=1.
      jax.config.update("jax_compilation_cache_dir", None)
    jax.distributed.initialize(**_local_devices())
    check_even_devices(jax.devices())
    return True
  return False


def check_even_devices(devices) -> None:
  """UserError when the job's processes hold different numbers of devices (a SLURM job over
  nodes with 4 GPUs and with 2): the mesh's axes split every process alike."""
  per_process = {}
  for device in devices:
    per_process[device.process_index] = per_process.get(device.process_index, 0) + 1
  if len(set(per_process.values())) > 1:
    counts = ", ".join(f"process {p}: {n}" for p, n in sorted(per_process.items()))
    raise UserError(f"the job's processes hold different numbers of devices ({counts}): ask "
                    "for the same number on every node (launch/slurm_gpu.sh --gpus-per-node)")


# Which of its node's devices a process uses: named outright ("0,...,7"), or derived on the node
# from what SLURM shows the task (SLURM_GPUS_ENV, set by launch/slurm_gpu.sh).
LOCAL_DEVICES_ENV = "NORMSTUDY_LOCAL_DEVICE_IDS"
# "node": one task per node uses every GPU it is shown; "task": one task per GPU uses its own.
SLURM_GPUS_ENV = "NORMSTUDY_SLURM_GPUS"


def slurm_device_ids(env) -> list | None:
  """The device ordinals a SLURM task uses, from what SLURM shows it (`env`: its environment),
  never rewriting CUDA_VISIBLE_DEVICES (Levanter derives them the same way). CUDA numbers the
  devices CUDA_VISIBLE_DEVICES lists 0..n-1, so an ordinal is a position in that list:
    node  every device shown: 0..n-1 (n from CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE)
    task  one device shown (--gpus-per-task, --gpu-bind, per-task cgroups): 0; the node's list
          shown (no binding, with or without device cgroups, a job owning GPUs 4-7 sees
          "4,5,6,7"): the SLURM_LOCALID-th
  None when `env` does not ask (SLURM_GPUS_ENV unset). UserError for a task the rule cannot
  place (no GPU shown, or more tasks on the node than GPUs)."""
  mode = env.get(SLURM_GPUS_ENV, "").strip()
  if not mode:
    return None
  if mode not in ("node", "task"):
    raise UserError(f"{SLURM_GPUS_ENV}={mode!r} is not allowed; allowed: node, task")
  shown = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
  count = len(shown)
  if not count:
    on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
    count = int(on_node) if on_node.isdigit() else 0
  if count == 0:
    raise UserError("this SLURM task is shown no GPU (CUDA_VISIBLE_DEVICES and "
                    "SLURM_GPUS_ON_NODE are unset or empty): ask for GPUs (--gpus-per-node)")
  if mode == "node":
    return list(range(count))
  if count == 1:
    return [0]
  local = int(env.get("SLURM_LOCALID", "0"))
  if local >= count:
    raise UserError(f"SLURM task {local} of its node is shown {count} GPUs "
                    f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')}): one task "
                    "per GPU needs at most as many tasks per node as GPUs")
  return [local]


def local_device_ids(env=None) -> list | None:
  """The device ids NORMSTUDY_LOCAL_DEVICE_IDS names, else those the SLURM rule derives
  (slurm_device_ids), or None (neither: JAX's default, which on SLURM is the one device
  numbered SLURM_LOCALID). UserError for another value."""
  import os
  env = os.environ if env is None else env
  text = env.get(LOCAL_DEVICES_ENV, "").strip()
  if not text:
    return slurm_device_ids(env)
  try:
    ids = [int(part) for part in text.split(",")]
  except ValueError:
    ids = []
  if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
    raise UserError(f"{LOCAL_DEVICES_ENV}={text!r} is not allowed; allowed: distinct device "
                    "numbers >= 0, comma-separated (launch/slurm_gpu.sh sets it)")
  return ids


def _local_devices() -> dict:
  ids = local_device_ids()
  return {} if ids is None else {"local_device_ids": ids}


def detected_cluster() -> str | None:
  """The name of the multi-process cluster JAX's own detection finds (the registry that
  jax.distributed.initialize() with no arguments consults: a Cloud TPU VM or GKE TPU slice,
  SLURM, Kubernetes), or None. A cluster of one process (a SLURM job of one task) is none;
  opt-in kinds (MPI) and Kubernetes without its client package (whose check only warns) are
  not asked. The registry is private to jax (jax._src.clusters, jax 0.10); without it, None."""
  import importlib.util
  try:
    from jax._src.clusters import ClusterEnv
  except ImportError:
    return None
  for env in ClusterEnv._cluster_types:  # pylint: disable=protected-access
    if env.opt_in_only_method or (env.__name__ == "K8sCluster"
                                  and importlib.util.find_spec("kubernetes") is None):
      continue
    try:
      present = env.is_env_present()
      many = present and (env.__name__ != "SlurmCluster" or env.get_process_count() > 1)
    except Exception:  # noqa: BLE001 (a half-set environment is no cluster)
      continue
    if many:
      return env.__name__
  return None


def global_batch(mesh, local_batch: dict, sharding: NamedSharding | None = None) -> dict:
  """Device arrays of the global batch [runs, batch, ...] (or, with block_sharding, a block's
  batches [runs, steps, batch, ...]), from this process's rows of it."""
  sharding = sharding or batch_sharding(mesh)
  if jax.process_count() == 1:
    return jax.device_put(local_batch, sharding)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch)


def global_runs_values(mesh, values) -> jax.Array:
  """A device array [runs] of per-run values every process holds in full (e.g. how many steps
  a block takes), placed as runs_sharding places per-run values."""
  values = np.asarray(values)
  return jax.make_array_from_callback(values.shape, runs_sharding(mesh), lambda index: values[index])
