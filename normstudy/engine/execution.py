"""How the K runs of one program step: the compiled steps and the state in the form they take.

  steps = ProgramSteps(config, mesh, num_runs=K)
  state = steps.initial(configs)          # or steps.hold(stacked), e.g. a restored checkpoint
  state, metrics = steps.train(state, batch)   # steps.telemetry: the same with telemetry
  state, metrics = steps.step(state, batch, telemetry, stopped)   # what the loop calls
  state, metrics = steps.step_block(state, work, stopped)   # steps.block_work(...) steps at once
  losses = steps.eval(steps.params(state), batch)
  flags = steps.locate(state, batch)      # compiled on first use: where a step went non-finite
  logits = steps.outputs(steps.params(state), batch)   # compiled on first use: f(x; theta)
  checkpoints.save(..., steps.stacked(state))

Every state leaf carries a leading run axis of size K (normstudy.engine.sharding places it), and a
program's runs step in one of two ways, chosen once here:
  vmapped         one compiled K-run program (`jax.vmap` over the run axis) on the stacked
                  state: an accelerator's speed comes from stacking
  one at a time   the compiled one-run program (the one normstudy.main runs) called per run,
                  the state held as K one-run states [1, ...], each donated to and returned by
                  its own step: on XLA:CPU with the runs axis unsplit (normstudy.engine.platform),
                  where every run of a sweep then computes bit for bit what it computes alone
                  and its sweep.json command reproduces it (benchmarks/grids.py compares both)
The loop never asks which: it holds whatever `initial`/`hold` return and hands it back.
"""

from typing import Any, NamedTuple

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from normstudy.core import per_run
from normstudy.core import steps as steps_lib
from normstudy.engine import platform
from normstudy.engine import sharding
from normstudy.records import keys


# The compiled steps of the programs this process trained last, by ProgramSteps._key: a search
# trains each arm's program again every round, and a sweep's worker several programs of one
# structure; kept, the next one's steps are neither traced again nor loaded from the compile
# cache (about 8 s a program at the seed size on 2 CPU cores: docs/throughput.md). Same
# executables, same bits.
KEPT_PROGRAMS = 16
_KEPT = {}


class _Compiled(NamedTuple):
  """What ProgramSteps keeps of a program: its jitted steps (each traced and compiled on its
  first call), the steps compiled on first use, the initialiser, and the one-at-a-time
  program's take and join (None when its runs are vmapped)."""
  train: Any
  telemetry: Any
  eval: Any
  block: Any
  on_use: dict
  init: Any
  take: Any
  join: Any


def _join(parts):
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


def _take(tree, k):
  return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, k, 1), tree)


def _with_rules(fn):
  """`fn` traced with the logical-axis rules, so the model's activation constraints
  (normstudy.core.layers.constrain) name mesh axes."""
  def ruled(*args):
    with nn.logical_axis_rules(sharding.RULES):
      return fn(*args)
  return ruled


def over_runs(fn, num_runs: int):
  """`fn` of one run, applied to K runs stacked on a leading axis: vmapped for K > 1; for one
  run the axis is squeezed away and restored around `fn` itself (a reshape, free: a vmapped step
  of one run is slower on XLA:CPU, benchmarks/throughput.py)."""
  if num_runs > 1:
    return jax.vmap(fn, spmd_axis_name="runs")

  def one_run(*args):
    out = fn(*jax.tree.map(lambda x: x[0], args))
    return jax.tree.map(lambda x: x[None], out)

  return one_run


def _run_by_run(one_run, batch_sharding, updates_state: bool):
  """fn(firsts, batch, stopped=()) for K runs held as K one-run values `firsts` ([1, ...] each)
  and the stacked batch: K calls of the compiled one-run program `one_run`, outputs joined on
  the run axis (with `updates_state`, the list of new states and the joined metrics). A run in
  `stopped` (indices of runs whose state has stopped: frozen, normstudy.core.steps) is not
  stepped: its state stays as it is, and its metrics are a stepped run's marked inactive
  (`active` False), which the loop never records."""
  take_batch = jax.jit(_take, out_shardings=batch_sharding)
  join = jax.jit(_join)

  def step(firsts, batch, stopped=()):
    if not updates_state:
      return join([one_run(first, take_batch(batch, k)) for k, first in enumerate(firsts)])
    skipped = set(stopped) if len(set(stopped)) < len(firsts) else set()
    outs = {k: one_run(first, take_batch(batch, k)) for k, first in enumerate(firsts)
            if k not in skipped}
    if skipped:
      metrics = next(iter(outs.values()))[1]
      inactive = {**metrics, keys.ACTIVE: jnp.zeros_like(metrics[keys.ACTIVE])}
      outs.update({k: (firsts[k], inactive) for k in skipped})
    outs = [outs[k] for k in range(len(firsts))]
    return [out[0] for out in outs], join([out[1] for out in outs])

  return step


def _initializer(config):
  """values [K, ...] -> the stacked (unboxed) initial state of K runs of `config`'s structure."""
  return jax.vmap(lambda values: steps_lib.unboxed(steps_lib.init_state(config, values)))


def _abstract(init, mesh, shardings, stacked_values):
  """ShapeDtypeStructs, with `shardings`, of the stacked initial state of `stacked_values`
  (`init`: the program's jitted initializer; traced on `mesh` as its call is, so that the call
  reuses this trace)."""
  with jax.set_mesh(mesh):
    shapes = jax.eval_shape(init, stacked_values)
  return jax.tree.map(lambda s, where: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=where),
                      shapes, shardings)


def _host_values(held, part, one_at_a_time: bool):
  if not one_at_a_time:
    return jax.device_get(part(held))
  return jax.tree.map(lambda *xs: np.concatenate(xs), *[jax.device_get(part(s)) for s in held])


def steps_one_at_a_time(devices, runs_axis: int, num_runs: int) -> bool:
  """Whether a program of `num_runs` runs compiled for `devices`, with a runs mesh axis of
  size `runs_axis`, steps its runs one at a time (normstudy.engine.platform's choice, where the runs
  axis is unsplit)."""
  return platform.choices(devices).runs_one_at_a_time and runs_axis == 1 and num_runs > 1


class ProgramSteps:
  """The compiled steps of K runs of one program on `mesh`, and how they hold the state:
  `config` is the first run's (its structure is every run's); `one_at_a_time`: True or False
  forces a stepping mode (benchmarks, tests), None lets normstudy.engine.platform decide from the
  mesh's devices. Attributes: `shardings` (of the stacked state), `one_at_a_time`, `choices`
  (normstudy.engine.platform.Choices), and the compiled `train`, `telemetry` and `eval`. The
  work is module functions over it (_build_steps, _block_work, ...); the methods name them."""

  def __init__(self, config, mesh, num_runs: int, one_at_a_time: bool | None = None):
    self.config, self.mesh, self.num_runs = config, mesh, num_runs
    self.choices = platform.choices(mesh.devices.flat)
    if one_at_a_time is None:
      one_at_a_time = steps_one_at_a_time(mesh.devices.flat, mesh.shape["runs"], num_runs)
    self.one_at_a_time = bool(one_at_a_time) and num_runs > 1
    self.shardings = sharding.state_shardings(config, mesh)
    self.batch_sharding = sharding.batch_sharding(mesh)
    self.work_sharding = {"batches": sharding.block_sharding(mesh),
                          "count": sharding.runs_sharding(mesh)}
    kept = _kept_steps(self)
    self.train, self.telemetry, self.eval, self.block = (kept.train, kept.telemetry, kept.eval,
                                                         kept.block)
    self.compiled_on_use, self.init, self.take, self.join = (kept.on_use, kept.init, kept.take,
                                                             kept.join)

  def step(self, held, batch, telemetry: bool = False, stopped=()) -> tuple:
    """(state, metrics) of the next step of the held state (`telemetry`: with telemetry).
    `stopped`: runs whose state has stopped (finished or halted: frozen); stepped one at a
    time, they are not computed again, sparing a search its failed runs' remaining steps."""
    fn = self.telemetry if telemetry else self.train
    return fn(held, batch, stopped) if self.one_at_a_time else fn(held, batch)

  def block_work(self, batches: list, length: int) -> dict:
    """The work of a block of `batches` (at most `length`), staged (_block_work)."""
    return _block_work(self, batches, length)

  def step_block(self, held, work, stopped=()) -> tuple:
    """(state, metrics [K, length, ...]) after the block `work` of the held state
    (normstudy.core.steps.make_train_block); `stopped` as for `step`."""
    return self.block(held, work, stopped) if self.one_at_a_time else self.block(held, work)

  def initial(self, configs) -> Any:
    """The held initial state of runs of `configs`, each run's values those of the run alone."""
    return _initial(self, configs)

  def abstract(self, configs) -> Any:
    """The stacked state's ShapeDtypeStructs with shardings, computing nothing (_abstract)."""
    return _abstract(self.init, self.mesh, self.shardings, per_run.stacked_values(configs))

  def host_values(self, held, part) -> Any:
    """`part(state)` of every run on the host, stacked [K, ...], not the whole state."""
    return _host_values(held, part, self.one_at_a_time)

  def hold(self, stacked) -> Any:
    """The stacked state [K, ...] in the form the steps take."""
    if self.one_at_a_time:
      return [self.take(stacked, k) for k in range(self.num_runs)]
    return stacked

  def stacked(self, held) -> Any:
    """The stacked state [K, ...] of a held state (a copy when the runs step one at a time)."""
    return self.join(held) if self.one_at_a_time else held

  def params(self, held) -> Any:
    """The parameters, as `eval` takes them."""
    return [s.params for s in held] if self.one_at_a_time else held.params

  def locate(self, held, batch):
    """The finiteness flags of every forward site of the step `held` took on `batch`
    (normstudy.core.steps.make_locate_step), [K, ...]."""
    return _on_first_use(self, steps_lib.make_locate_step, self.shardings)(held, batch)

  def outputs(self, params, batch):
    """Each run's float32 output logits on `batch` (steps.make_output_step), [K, ...]."""
    return _on_first_use(self, steps_lib.make_output_step, self.shardings.params)(params, batch)


def _kept_steps(steps: ProgramSteps) -> "_Compiled":
  """The program's compiled steps, kept by structure (the newest last; the least recently used
  goes first past KEPT_PROGRAMS): a later program of the same structure neither traces nor
  loads them again."""
  key = _program_key(steps)
  kept = _KEPT.pop(key, None)
  if kept is None:
    kept = _build_steps(steps)
  _KEPT[key] = kept
  while len(_KEPT) > KEPT_PROGRAMS:
    del _KEPT[next(iter(_KEPT))]
  return kept


def _program_key(steps: ProgramSteps) -> tuple:
  """What the compiled steps depend on: the program's structure (per_run.program_key: its
  config without per-run fields), the mesh's devices and axes, the stepping mode and K when
  the runs are vmapped, and the platform's choices."""
  mesh = (steps.mesh.axis_names, steps.mesh.devices.shape,
          tuple(d.id for d in steps.mesh.devices.flat))
  runs = 1 if steps.one_at_a_time else steps.num_runs
  choices = (steps.choices.fusion_boundaries,
             tuple(sorted((k, str(v)) for k, v in steps.choices.compiler_options.items())))
  return (per_run.program_key(steps.config), mesh, steps.one_at_a_time, runs, choices)


def _build_steps(steps: ProgramSteps) -> "_Compiled":
  """The compiled steps (jitted: traced and compiled on their first call) of this program."""
  config, boundaries, shardings = steps.config, steps.choices.fusion_boundaries, steps.shardings
  train = _compile(steps, steps_lib.make_train_step(config, False, boundaries), shardings,
                   updates_state=True)
  telemetry = _compile(steps, steps_lib.make_train_step(config, True, boundaries), shardings,
                       updates_state=True)
  eval_ = _compile(steps, steps_lib.make_eval_step(config, boundaries), shardings.params,
                   updates_state=False)
  block = _compile(steps, steps_lib.make_train_block(config, boundaries), shardings,
                   updates_state=True, work_sharding=steps.work_sharding)
  init = jax.jit(_initializer(config), out_shardings=shardings)
  take = jax.jit(_take, out_shardings=shardings) if steps.one_at_a_time else None
  join = jax.jit(_join, out_shardings=shardings) if steps.one_at_a_time else None
  return _Compiled(train, telemetry, eval_, block, {}, init, take, join)


def _compile(steps: ProgramSteps, fn, first_sharding, updates_state: bool, work_sharding=None):
  """fn(first, batch) of one run as a step of the program's K runs. `updates_state`: fn
  returns (new state, metrics) and the state is donated. `work_sharding`: of fn's second
  argument when it is not one batch (a block's work)."""
  outputs = sharding.runs_sharding(steps.mesh)
  work_sharding = work_sharding or steps.batch_sharding
  step = jax.jit(over_runs(_with_rules(fn), 1 if steps.one_at_a_time else steps.num_runs),
                 in_shardings=(first_sharding, work_sharding),
                 out_shardings=(first_sharding, outputs) if updates_state else outputs,
                 donate_argnums=0 if updates_state else (),
                 compiler_options=steps.choices.compiler_options)
  return _run_by_run(step, work_sharding, updates_state) if steps.one_at_a_time else step


def _block_work(steps: ProgramSteps, batches: list, length: int) -> dict:
  """The work of a block: `batches` (this process's rows of each step's stacked batch
  [K, ...], at most `length` of them) staged on the devices at once, padded to `length`
  (the block's compiled size) with the last, and how many of them to take."""
  count = len(batches)
  if not 0 < count <= length:
    raise ValueError(f"a block of {count} steps does not fit a block of at most {length}")
  padded = batches + [batches[-1]] * (length - count)
  local = {key: np.stack([b[key] for b in padded], axis=1) for key in padded[0]}
  return {"batches": sharding.global_batch(steps.mesh, local, steps.work_sharding["batches"]),
          "count": sharding.global_runs_values(steps.mesh, np.full(steps.num_runs, count,
                                                                   np.int32))}


def _initial(steps: ProgramSteps, configs) -> Any:
  """The held initial state of runs whose configs share this program, created in its shards:
  each run's values are those of the run alone on one device."""
  with jax.set_mesh(steps.mesh):
    if steps.one_at_a_time:  # each run from the one-run initialiser, as alone
      return [steps.init(per_run.stacked_values([c])) for c in configs]
    return steps.init(per_run.stacked_values(configs))


def _on_first_use(steps: ProgramSteps, make_step, first_sharding):
  """The program's step of `make_step(config, fusion_boundaries)` (no state update), compiled
  on its first call and kept."""
  if make_step not in steps.compiled_on_use:
    steps.compiled_on_use[make_step] = _compile(
        steps, make_step(steps.config, steps.choices.fusion_boundaries), first_sharding,
        updates_state=False)
  return steps.compiled_on_use[make_step]
