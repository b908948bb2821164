"""Ahead-of-time compilation for a TPU topology on a machine without a TPU (MaxText's
train_compile.py is the model): what one chip of a pod needs for a config, learnt on a laptop.

  prepare_tpu_compiler()          points JAX at a TPU compiler (libtpu) before JAX starts one
  topology_devices(name)          the devices of a TPU topology ("v5e:2x2", "v4:2x2x4", ...)
  compile_for(config, devices)    the train and eval steps compiled as normstudy.main would
                                  compile them there: per-chip bytes, FLOPs, collectives, the
                                  memory plan (normstudy.core.memory) beside them

The TPU compiler is libtpu, installed apart from the environment that trains (`make tpu-aot`
puts the version this jax needs into .tpu-aot/): in the training environment every process
would otherwise load it at start and print its TPU-detection warnings.
"""

import dataclasses
import os
import re

import numpy as np

from normstudy.core import memory
from normstudy.errors import UserError

TPU_AOT_DIR = ".tpu-aot"
# HBM per chip that XLA lets a program use, by JAX's device_kind (v5e: 15.75 of its 16 GiB, as
# its out-of-memory message says).
HBM_GIB = {"TPU v4": 32, "TPU v5 lite": 15.75, "TPU v5": 95, "TPU v5p": 95, "TPU v6 lite": 32}
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
                  "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
# Topology name -> what libtpu takes for TPU_ACCELERATOR_TYPE (chips x cores per chip).
_ACCELERATOR = {"v4": ("v4", 2), "v5e": ("v5litepod", 1), "v5p": ("v5p", 2), "v6e": ("v6e", 1)}
_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")


def _repo_root() -> str:
  return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check_topology(name: str) -> int:
  """The number of chips of a topology name; UserError for one this does not know."""
  match = _TOPOLOGY.match(name)
  # v5e and v6e slices are 2-D (AxB), v4 and v5p 3-D (AxBxC): a shape of the other rank is
  # none of them (v5e:4x4x4 was once taken as a 64-chip v5e).
  rank = {"v4": 3, "v5p": 3, "v5e": 2, "v6e": 2}
  if not match or len(match.group(2).split("x")) != rank[match.group(1)]:
    raise UserError(f"--topology={name!r} is not a TPU topology this knows; allowed: "
                    "v4:AxBxC, v5e:AxB, v5p:AxBxC, v6e:AxB (e.g. v5e:2x2, v5e:4x4, v4:2x2x4)")
  return int(np.prod([int(n) for n in match.group(2).split("x")]))


def prepare_tpu_compiler(topology: str) -> str:
  """Sets what libtpu reads at start (where it is, and that this machine is no TPU host, so it
  neither queries a metadata server nor warns); call before JAX starts a backend. Returns the
  library's path; UserError when there is none."""
  path = os.environ.get("TPU_LIBRARY_PATH")
  if not path:
    candidate = os.path.join(_repo_root(), TPU_AOT_DIR, "libtpu", "libtpu.so")
    path = candidate if os.path.exists(candidate) else None
  if not path:
    import importlib.util  # an environment that has libtpu installed itself
    spec = importlib.util.find_spec("libtpu")
    if spec and spec.origin:
      path = os.path.join(os.path.dirname(spec.origin), "libtpu.so")
  if not path or not os.path.exists(path):
    raise UserError("no TPU compiler (libtpu) found: run `make tpu-aot` (it installs the "
                    f"version this jax needs into {TPU_AOT_DIR}/), or set TPU_LIBRARY_PATH")
  family, _ = topology.split(":", 1)
  name, cores = _ACCELERATOR[family]
  os.environ["TPU_LIBRARY_PATH"] = path
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  # libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) for the chips it drives; compiling
  # opens no chip, and two compilations at once (a test suite's workers) must not collide.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{name}-{check_topology(topology) * cores}")
  return path


def topology_devices(name: str) -> list:
  """The devices of TPU topology `name` (prepare_tpu_compiler first)."""
  check_topology(name)
  from jax.experimental import topologies
  try:
    return list(topologies.get_topology_desc(topology_name=name, platform="tpu").devices)
  except Exception as e:  # noqa: BLE001 (libtpu's refusal of a shape it does not know)
    raise UserError(f"--topology={name!r}: the TPU compiler does not know it "
                    f"({' '.join(str(e).split())[:200]})") from None


def collectives(hlo_text: str) -> dict:
  """{op: {"count", "bytes"}} of the collectives in an optimized HLO module (bytes of each
  op's result, tuples summed)."""
  found = {op: {"count": 0, "bytes": 0} for op in COLLECTIVES}
  pattern = re.compile(r"=\s*(\(?[^=]*?\)?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
  for shapes, op in pattern.findall(hlo_text):
    found[op]["count"] += 1
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shapes):
      size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
      found[op]["bytes"] += size * _ELEMENT_BYTES.get(dtype, 4)
  return found


@dataclasses.dataclass
class Compiled:
  """One chip's figures of a config compiled for a topology."""
  topology: str
  device_kind: str
  chips: int
  mesh: dict
  hbm_bytes: int
  arguments: int
  temporaries: int
  parameters: int  # of the arguments: this chip's shards of the parameters
  optimizer_state: int  # and of the optimizer state (from the state's shardings)
  outputs: int
  flops: float  # the compiler's cost_analysis: a while loop's body once (a scanned stack: 1/L)
  collectives: dict
  plan: memory.MemoryPlan
  error: str | None = None  # the compiler's refusal (temporaries over HBM), if it refused
  analytic_flops: float = float("nan")  # per chip: memory.train_flops / chips, every layer

  @property
  def total(self) -> int:
    return self.arguments + self.temporaries

  @property
  def fits(self) -> bool:
    return self.error is None and self.total <= self.hbm_bytes

  def as_json(self) -> dict:
    return {"topology": self.topology, "device_kind": self.device_kind, "chips": self.chips,
            "mesh": self.mesh, "fits": self.fits, "hbm_bytes": self.hbm_bytes,
            "flops": None if self.flops != self.flops else self.flops,  # NaN: not compiled
            "analytic_flops": self.analytic_flops,
            "per_chip_bytes": {
                "arguments": self.arguments, "parameters": self.parameters,
                "optimizer_state": self.optimizer_state, "temporaries": self.temporaries,
                "outputs": self.outputs, "total": self.total},
            "plan": self.plan.as_json(), "collectives": self.collectives, "error": self.error}


def compile_for(config, devices, topology: str = "") -> Compiled:
  """The train step of `config` compiled as normstudy.main compiles it, for `devices`, on the
  config's mesh (UserError for a mesh or size that does not divide)."""
  import jax
  from normstudy.engine import execution
  from normstudy.engine import sharding
  sizes = sharding.mesh_shape(config.mesh, len(devices))
  sharding.check_divisible(config, sizes)
  mesh = sharding.make_mesh(config.mesh, devices)
  steps = execution.ProgramSteps(config, mesh, num_runs=1)
  shape = (1, config.train.batch_size, config.model.max_len)
  where = sharding.batch_sharding(mesh)
  batch = {"tokens": jax.ShapeDtypeStruct(shape, np.int32, sharding=where)}
  if not config.model.causal:
    batch["mask"] = jax.ShapeDtypeStruct(shape, np.bool_, sharding=where)
  kind = devices[0].device_kind
  figures = dict(topology=topology, device_kind=kind, chips=len(devices), mesh=sizes,
                 hbm_bytes=int(HBM_GIB.get(kind, 16) * memory.GIB),
                 plan=memory.plan(config, sizes),
                 analytic_flops=memory.train_flops(config) / len(devices))
  state = steps.abstract([config])  # outside the mesh: its host values are not the chips'
  figures.update(parameters=_shard_bytes(state.params),
                 optimizer_state=_shard_bytes(state.opt_state))
  with jax.set_mesh(mesh):
    lowered = steps.train.lower(state, batch)
    try:
      compiled = lowered.compile()
    except Exception as e:  # noqa: BLE001 (XLA's out-of-memory refusal is a figure, not a bug)
      text = " ".join(str(e).split())
      if "exceeds available HBM" not in text and "Ran out of memory" not in text:
        raise
      return Compiled(**figures, arguments=0, temporaries=_temporaries_of(text), outputs=0,
                      flops=float("nan"), collectives={}, error=text[:300])
  analysis = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, list) else cost
  return Compiled(**figures, arguments=int(analysis.argument_size_in_bytes),
                  temporaries=int(analysis.temp_size_in_bytes),
                  outputs=int(analysis.output_size_in_bytes), flops=float(cost.get("flops", 0)),
                  collectives=collectives(compiled.as_text()))


def _shard_bytes(tree) -> int:
  """The bytes one chip holds of `tree` (ShapeDtypeStructs with shardings): the largest shard
  of each leaf (shards of a leaf are equal when its dimensions divide, as check_divisible
  ensures)."""
  import jax
  return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def _temporaries_of(message: str) -> int:
  """The bytes of temporaries XLA's out-of-memory refusal names ("... temporaries (89.82G)")."""
  match = re.search(r"temporaries \(([\d.]+)([KMGT])\)", message)
  if not match:
    return 0
  return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2)))
