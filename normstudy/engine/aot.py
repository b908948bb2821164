"""Ahead-of-time compilation for a TPU topology on a machine without a TPU (MaxText's
train_compile.py is the model): what one chip of a pod needs for a config, learnt on a laptop.

  prepare_tpu_compiler()          points JAX at a TPU compiler (libtpu) before JAX starts one
  topology_devices(name)          the devices of a TPU topology ("v5e:2x2", "v4:2x2x4", ...),
                                  as the hardware shows them (v4: megacore, one device a chip)
  device_hbm_bytes(device)        the HBM XLA lets one device's program use, as the compiler
                                  says it (a table where it does not)
  compile_for(config, devices)    the train and eval steps compiled as normstudy.main would
                                  compile them there: per-chip bytes, FLOPs (counted from the
                                  model and the compiler's), collectives (in the program and per
                                  step), the memory plan (normstudy.engine.memory) beside them

The TPU compiler is libtpu, installed apart from the environment that trains (`make tpu-aot`
puts the version this jax needs into .tpu-aot/): in the training environment every process
would otherwise load it at start and print its TPU-detection warnings.
"""

import dataclasses
import os
import re

import numpy as np

from normstudy.engine import memory
from normstudy.errors import UserError

TPU_AOT_DIR = ".tpu-aot"
# HBM per device that XLA lets a program use, by JAX's device_kind, as the compiler's own
# out-of-memory refusal states it (libtpu 0.0.42.1, 2026-12-02; v4 and v5p as megacore devices,
# one per chip): what device_hbm_bytes falls back on when the compiler does not say.
HBM_GIB = {"TPU v4": 30.75, "TPU v5 lite": 15.75, "TPU v5": 95.74, "TPU v5p": 95.74,
           "TPU v6 lite": 31.25}
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
                  "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
# Topology name -> what libtpu takes for TPU_ACCELERATOR_TYPE (chips x cores per chip).
_ACCELERATOR = {"v4": ("v4", 2), "v5e": ("v5litepod", 1), "v5p": ("v5p", 2), "v6e": ("v6e", 1)}
_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")
# v4 chips have two TensorCores; JAX lists one device per core unless the chip config is
# "megacore", which is what a v4 TPU VM shows (16 devices on v4-32) and what MaxText compiles
# for. v5p is megacore by default; v5e and v6e have one core a chip.
_CHIP_CONFIG = {"v4": "megacore"}


def _repo_root() -> str:
  return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check_topology(name: str) -> int:
  """The number of chips of a topology name; UserError for one this does not know."""
  match = _TOPOLOGY.match(name)
  # v5e and v6e slices are 2-D (AxB), v4 and v5p 3-D (AxBxC): a shape of the other rank is
  # none of them (v5e:4x4x4 is no 64-chip v5e).
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
  family = name.split(":", 1)[0]
  chip_config = {"chip_config_name": _CHIP_CONFIG[family]} if family in _CHIP_CONFIG else {}
  try:
    return list(topologies.get_topology_desc(topology_name=name, platform="tpu",
                                             **chip_config).devices)
  except Exception as e:  # noqa: BLE001 (libtpu's refusal of a shape it does not know)
    raise UserError(f"--topology={name!r}: the TPU compiler does not know it "
                    f"({' '.join(str(e).split())[:200]})") from None


_COLLECTIVE = re.compile(r"=\s*(\(?[^=]*?\)?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


def _add_collectives(found: dict, text: str, times: int = 1) -> None:
  for shapes, op in _COLLECTIVE.findall(text):
    found[op]["count"] += times
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shapes):
      size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
      found[op]["bytes"] += times * size * _ELEMENT_BYTES.get(dtype, 4)


def collectives(hlo_text: str) -> dict:
  """{op: {"count", "bytes"}} of the collective ops in an optimized HLO module, each counted
  once however often it runs (bytes of each op's result, tuples summed): the program's static
  ops. collectives_per_step counts what one step executes."""
  found = {op: {"count": 0, "bytes": 0} for op in COLLECTIVES}
  _add_collectives(found, hlo_text)
  return found


def _computations(hlo_text: str) -> tuple[dict, str]:
  """{name: body text} of an HLO module's computations, and the entry computation's name."""
  bodies, entry, name, lines = {}, None, None, []
  for line in hlo_text.splitlines():
    if name is None:
      match = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
      if match:
        name, lines = match.group(2), []
        entry = name if match.group(1) else entry
    elif line.startswith("}"):
      bodies[name], name = "\n".join(lines), None
    else:
      lines.append(line)
  return bodies, entry


def _trip_count(condition: str) -> int | None:
  """A while loop's trip count from its condition computation: the counter compared "less
  than" a constant (a scan's or fori_loop's form, counting from 0 by 1); None otherwise."""
  constants = dict(re.findall(r"%([\w.\-]+) = s32\[\]\S* constant\((-?\d+)\)", condition))
  compare = re.search(r"compare\(%[\w.\-]+, %([\w.\-]+)\), direction=LT", condition)
  if compare and compare.group(1) in constants:
    return int(constants[compare.group(1)])
  return None


def collectives_per_step(hlo_text: str) -> dict:
  """{op: {"count", "bytes"}} of the collectives one execution of an optimized HLO module
  performs: each op times the trip counts of the while loops around it (a scanned layer stack,
  the TPU partitioner's windowed matmuls), a conditional's costliest branch. A loop whose trip
  count its condition does not state counts once, and "loops_unknown" says how many did."""
  bodies, entry = _computations(hlo_text)
  memo, unknown = {}, set()
  call = re.compile(r"(?:calls|to_apply)=%([\w.\-]+)")
  loop = re.compile(r"condition=%([\w.\-]+), body=%([\w.\-]+)")
  branches = re.compile(r"branch_computations=\{([^}]*)\}")

  def total(name: str) -> dict:
    if name in memo:
      return memo[name]
    memo[name] = found = {op: {"count": 0, "bytes": 0} for op in COLLECTIVES}
    text = bodies.get(name, "")
    _add_collectives(found, text)
    inner = [(callee, 1) for callee in call.findall(text)]
    for condition, body in loop.findall(text):
      trips = _trip_count(bodies.get(condition, ""))
      if trips is None:
        unknown.add(body)
      inner.append((body, 1 if trips is None else trips))
    for group in branches.findall(text):
      names = re.findall(r"%([\w.\-]+)", group)
      costliest = max(names, key=lambda n: sum(v["bytes"] for v in total(n).values()),
                      default=None)
      if costliest is not None:
        inner.append((costliest, 1))
    for callee, times in inner:
      for op, v in total(callee).items():
        found[op]["count"] += times * v["count"]
        found[op]["bytes"] += times * v["bytes"]
    return found

  result = {op: dict(v) for op, v in total(entry).items()} if entry else {}
  result["loops_unknown"] = len(unknown)
  return result


_AVAILABLE_HBM = re.compile(r"exceeds available HBM \(([\d.]+)([KMGT])\)")
_HBM_ASKED = {}


def device_hbm_bytes(device) -> tuple[int, str]:
  """(bytes, source): the HBM XLA lets a program on `device` use, read from the compiler's
  refusal of a program far too large for it ("compiler"), or HBM_GIB's entry for its kind
  where the compiler does not say ("table"; 16 GiB for a kind the table does not know). Asked
  once per device kind."""
  kind = device.device_kind
  if kind not in _HBM_ASKED:
    _HBM_ASKED[kind] = _ask_compiler_hbm(device)
  if _HBM_ASKED[kind] is not None:
    return _HBM_ASKED[kind], "compiler"
  return int(HBM_GIB.get(kind, 16) * memory.GIB), "table"


def _ask_compiler_hbm(device) -> int | None:
  import jax
  import jax.numpy as jnp
  where = jax.sharding.SingleDeviceSharding(device)

  def oversize(x):  # a sort keeps 2^36 floats (256 GiB) alive at once: no device has that
    return jnp.sort(jnp.broadcast_to(x, (2**18, 2**18)) * 2.0, axis=0)[0]

  try:
    jax.jit(oversize, in_shardings=where, out_shardings=where).lower(
        jax.ShapeDtypeStruct((2**18,), np.float32, sharding=where)).compile()
  except Exception as e:  # noqa: BLE001 (the refusal is the answer)
    match = _AVAILABLE_HBM.search(" ".join(str(e).split()))
    if match:
      return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2)))
  return None


@dataclasses.dataclass
class Compiled:
  """One chip's figures of a config compiled for a topology."""
  topology: str
  device_kind: str
  chips: int
  mesh: dict
  hbm_bytes: int  # per device: device_hbm_bytes
  arguments: int
  temporaries: int
  parameters: int  # of the arguments: this chip's shards of the parameters
  optimizer_state: int  # and of the optimizer state (from the state's shardings)
  outputs: int
  flops: float  # the compiler's cost_analysis: a while loop's body once (a scanned stack: 1/L)
  collectives: dict  # the program's collective ops, each once (aot.collectives)
  plan: memory.MemoryPlan
  error: str | None = None  # the compiler's refusal (temporaries over HBM), if it refused
  flops_per_step: float = float("nan")  # per chip: memory.train_flops / chips, every layer
  collectives_per_step: dict = dataclasses.field(default_factory=dict)  # executed in one step
  hbm_source: str = "table"  # where hbm_bytes comes from: "compiler" or "table"

  @property
  def total(self) -> int:
    return self.arguments + self.temporaries

  @property
  def fits(self) -> bool:
    return self.error is None and self.total <= self.hbm_bytes

  def as_json(self) -> dict:
    return {"topology": self.topology, "device_kind": self.device_kind, "chips": self.chips,
            "mesh": self.mesh, "fits": self.fits, "hbm_bytes": self.hbm_bytes,
            "hbm_source": self.hbm_source,
            # FLOPs of one step on one chip counted from the model (every layer, the remat
            # forward and attention): the step's figure. Beside it XLA's cost analysis of the
            # compiled program as written, which is not a step's FLOPs: it counts a while loop's
            # body once (a scanned stack's one layer) and, at MERT's size, is mostly the output
            # head. "compiler_flops" and "flops" are its older names (kept for readers of them).
            "flops_per_step": self.flops_per_step,
            "xla_cost_analysis_flops": None if self.flops != self.flops else self.flops,
            "compiler_flops": None if self.flops != self.flops else self.flops,  # NaN: refused
            "flops": None if self.flops != self.flops else self.flops,
            "collectives_per_step": self.collectives_per_step,
            "per_chip_bytes": {
                "arguments": self.arguments, "parameters": self.parameters,
                "optimizer_state": self.optimizer_state, "temporaries": self.temporaries,
                "outputs": self.outputs, "total": self.total},
            "plan": self.plan.as_json(), "collectives": self.collectives, "error": self.error}


def compile_for(config, devices, topology: str = "") -> Compiled:
  """The train step of `config` compiled as normstudy.main compiles it, for `devices`, on the
  config's mesh (UserError for a mesh or size that does not divide, or a kernel the devices
  lack)."""
  import jax
  from normstudy.engine import execution
  from normstudy.engine import platform
  from normstudy.engine import sharding
  platform.check_kernels(config, devices)
  sizes = sharding.mesh_shape(config.mesh, len(devices))
  sharding.check_divisible(config, sizes)
  mesh = sharding.make_mesh(config.mesh, devices)
  steps = execution.ProgramSteps(config, mesh, num_runs=1)
  shape = (1, config.train.batch_size, config.model.max_len)
  where = sharding.batch_sharding(mesh)
  batch = {"tokens": jax.ShapeDtypeStruct(shape, np.int32, sharding=where)}
  if not config.model.causal:
    batch["mask"] = jax.ShapeDtypeStruct(shape, np.bool_, sharding=where)
  hbm_bytes, hbm_source = device_hbm_bytes(devices[0])
  figures = dict(topology=topology, device_kind=devices[0].device_kind, chips=len(devices),
                 mesh=sizes, hbm_bytes=hbm_bytes, hbm_source=hbm_source,
                 plan=memory.plan(config, sizes, platform=devices[0].platform),
                 flops_per_step=memory.train_flops(config) / len(devices))
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
  text = compiled.as_text()
  cost = compiled.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, list) else cost
  return Compiled(**figures, arguments=int(analysis.argument_size_in_bytes),
                  temporaries=int(analysis.temp_size_in_bytes),
                  outputs=int(analysis.output_size_in_bytes), flops=float(cost.get("flops", 0)),
                  collectives=collectives(text), collectives_per_step=collectives_per_step(text))


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
