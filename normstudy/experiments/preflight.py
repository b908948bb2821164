"""Every check of a study's, sweep's or run's runs that must pass before anything is created or
written (`preflight`): each config (normstudy.experiments.validation), the mesh, the memory plan,
the workdir and data directory, the tracking extra, the data files, and, for a run directory
that holds a run, that its config may continue it (normstudy.core.per_run.config_differences).
"""

import importlib.util
import json
import os

from absl import logging
import jax

from normstudy.engine import memory
from normstudy.core import per_run
from normstudy.data import sources
from normstudy.engine import execution
from normstudy.engine import platform
from normstudy.engine import sharding
from normstudy.errors import UserError
from normstudy.experiments import validation
from normstudy.records import rundir
from normstudy.records import schema
from normstudy.records import storage


def preflight(runs: list, checkpoint_dir: str, allow_config_change: bool = False) -> None:
  """Every check that must pass before anything is created or written (raises UserError).

  A run directory with a checkpointed step holds a run, and a new config must match its
  config.json (fields that may change excepted); one with no checkpoint is not a run yet, and
  any config may take it."""
  sizes = sharding.mesh_shape(runs[0].config.mesh, jax.device_count())
  checkpointed = rundir.checkpointed_steps(storage.remote(checkpoint_dir))
  files_checked, noted = set(), set()
  for run in runs:
    validation.validate(run.config)
    note = parametrization_note(run.config)
    if note and note not in noted:  # once per distinct base, not per run
      logging.warning("%s", note)
      noted.add(note)
    platform.check_kernels(run.config, jax.devices())
    sharding.check_divisible(run.config, sizes, num_runs=len(runs))
    check_memory(run.config, sizes, len(runs))
    rundir.check_writable(run.directory, "--workdir")
    data_dir = run.config.data.data_dir
    if run.config.data.name != "text_files":
      data_dir = os.path.expanduser(data_dir) if data_dir else sources.default_dir()
      rundir.check_writable(data_dir, "config.data.data_dir")
      if not storage.is_url(data_dir):  # the dataset's cache, not the run: making it is safe
        rundir.ensure_directory(data_dir, "config.data.data_dir")
    check_tracking(run.config)
    corpus = json.dumps([run.config.data.to_dict(), run.config.model.max_len], default=str)
    if corpus not in files_checked:  # once per corpus, not per run
      sources.check_files(run.config)
      sources.check_corpus(run.config)
      _warn_small_synthetic(run.config)
      files_checked.add(corpus)
    if checkpointed and not allow_config_change:
      _check_saved_config(run, checkpointed)


def parametrization_note(config) -> str:
  """One line under muP or CompleteP saying what the run's base is: the
  width multiplier and where it comes from (model.base_width, its default 128 unless set), and
  which attention scale the run gets (model.base_head_dim 0: sp's 1/sqrt(d_head), right when
  heads are added with width; set: Table 3's 1/d_head, equal to sp's at that head width);
  "" for the other parametrizations."""
  from normstudy.core import config as config_lib
  from normstudy.core import parametrizations
  model = config.model
  if not parametrizations.get(model.parametrization).width_rules:
    return ""
  default = next(f.default for f in config_lib.FIELDS if f.name == "model.base_width")
  base = (f"model.base_width={model.base_width}"
          + (" (the default)" if model.base_width == default else ""))
  head_dim = model.d_model // model.num_heads
  attention = (f"attention q.k x sqrt({model.base_head_dim}) / {head_dim} (1/d_head, equal to "
               f"sp's at head width {model.base_head_dim})" if model.base_head_dim else
               f"attention q.k / sqrt({head_dim}) as sp's (model.base_head_dim=0: heads added "
               "with width keep their width; set it to the base's head width for 1/d_head)")
  return (f"{model.parametrization}: m_N = d_model {model.d_model} / {base} = "
          f"{parametrizations.width_mult(model):g}; {attention}")


def _warn_small_synthetic(config) -> None:
  """One warning when a synthetic split is asked for fewer tokens than a document holds: the
  split is one whole document, which the run then reads over and over."""
  data_cfg = config.data
  if data_cfg.name != "synthetic":
    return
  for split in ("train", "validation"):
    asked = data_cfg[f"{split}_tokens"]
    held = sources.synthetic_tokens(asked)
    if held >= 2 * asked:
      logging.warning("config.data.%s_tokens=%d is less than one synthetic document: the %s "
                      "split holds %d tokens (%d rows of config.model.max_len=%d)", split, asked,
                      split, held, held // config.model.max_len, config.model.max_len)


# The modes wandb.init takes (wandb 0.19-0.31; "dryrun" and "run" are its old names).
WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")


def check_tracking(config) -> None:
  """UserError when config.train.wandb_project asks for Weights & Biases and wandb is not
  installed (the `wandb` extra) or cannot be imported."""
  mode = os.environ.get("WANDB_MODE", "")
  if config.train.wandb_project and mode and mode not in WANDB_MODES:
    # wandb itself would turn W&B off without a word (the README promises a line).
    raise UserError(f"WANDB_MODE={mode!r} is not allowed; allowed: {', '.join(WANDB_MODES)} "
                    "(or unset: online with an API key, else offline)")
  if config.train.wandb_project and importlib.util.find_spec("wandb") is None:
    raise UserError(f"config.train.wandb_project={config.train.wandb_project!r} needs wandb, "
                    "which is not installed: pip install -e '.[wandb]'")
  if config.train.wandb_project:
    try:  # installed but broken (once: trained, exit 0, nothing sent, nothing said)
      importlib.import_module("wandb")
    except Exception as e:  # noqa: BLE001 (whatever its import raises)
      raise UserError(f"config.train.wandb_project={config.train.wandb_project!r}: wandb is "
                      f"installed but its import fails ({type(e).__name__}: "
                      f"{' '.join(str(e).split())[:160]})") from None


def memory_limit() -> tuple[int | None, str]:
  """(bytes one device's share of a program may use, what they are): on the CPU the host's
  memory shared by its local devices; on an accelerator the device's own, if it says."""
  device = jax.local_devices()[0]
  if device.platform == "cpu":
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return host // jax.local_device_count(), "this host's memory" + (
        f" shared by {jax.local_device_count()} devices" if jax.local_device_count() > 1 else "")
  stats = device.memory_stats() or {}
  return stats.get("bytes_limit"), f"the memory of one {device.device_kind}"


def check_memory(config, sizes: dict, num_runs: int, limit_and_what=None) -> None:
  """UserError when one device cannot hold the step: on the CPU when the memory plan's total
  (normstudy.engine.memory, a floor there) exceeds its share of the host's memory; on an
  accelerator, whose compiler schedules a step down to fit, when even the plan's `least` does
  (a warning when only the total does). The refusal names the knob that fits: fewer runs per
  program, block remat. `limit_and_what`: memory_limit()'s answer (tests give their own)."""
  limit, what = limit_and_what or memory_limit()
  if limit is None:
    return
  device_platform = jax.local_devices()[0].platform

  def needed(cfg, runs: int) -> memory.MemoryPlan:
    one_at_a_time = execution.steps_one_at_a_time(jax.devices(), sizes["runs"], runs)
    return memory.plan(cfg, sizes, runs, one_at_a_time, platform=device_platform)

  def floor(p: memory.MemoryPlan) -> int:
    return p.total if device_platform == "cpu" else p.least

  this = needed(config, num_runs)
  m = config.model
  if floor(this) <= limit:
    if this.total > limit:
      logging.warning("the memory plan's total %s per device exceeds the %.3g GiB of %s; the "
                      "compiler must schedule the step down towards its least, %s (slower steps, "
                      "or out of memory)", this.describe(), limit / memory.GIB, what,
                      memory.human(this.least))
    return
  at_least = (this.describe() if device_platform == "cpu" else
              f"{memory.human(this.least)} (scheduled as tightly as it goes; the plan's total "
              f"{this.describe()})")
  raise UserError(
      f"a run of num_layers={m.num_layers}, d_model={m.d_model}, d_ff={m.d_ff}, "
      f"max_len={m.max_len}, vocab_size={m.vocab_size}, "
      f"batch_size={config.train.batch_size}{f' x {num_runs} runs' if num_runs > 1 else ''} "
      f"needs at least {at_least} per device, more than the {limit / memory.GIB:.3g} GiB of "
      f"{what}; {_what_fits(config, num_runs, limit, needed, floor)}")


def _what_fits(config, num_runs: int, limit: int, needed, floor) -> str:
  """The knobs that bring the plan under `limit`, most specific first."""
  fits = []
  for k in range(num_runs - 1, 0, -1):  # the most runs a program of fewer can hold
    if floor(needed(config, k)) <= limit:
      fits.append(f"--max_runs_per_program={k} fits "
                  f"({memory.human(floor(needed(config, k)))} each program)")
      break
  if config.model.remat != "block":
    blocked = config.copy_and_resolve_references()
    with blocked.unlocked():
      blocked.model.remat = "block"
    for k in range(num_runs, 0, -1):
      if floor(needed(blocked, k)) <= limit:
        runs = "" if k == num_runs else f" with --max_runs_per_program={k}"
        fits.append(f"config.model.remat=block{runs} fits "
                    f"({memory.human(floor(needed(blocked, k)))})")
        break
  if fits:
    return "; ".join(fits)
  return ("neither fewer runs per program nor block remat fits: make the model, "
          "config.train.batch_size or config.model.max_len smaller, or use more devices")


def _check_saved_config(run, checkpointed: list) -> None:
  saved = rundir.RunDir(run.directory).saved_config()
  if not saved:
    raise UserError(
        f"{run.directory} has checkpoints (steps {', '.join(map(str, checkpointed[-2:]))}) but "
        f"no {schema.CONFIG}, so its config cannot be checked; restore that file, or pass "
        "--allow_config_change to continue it with this config")
  differences = per_run.config_differences(saved, rundir.config_json(run.config))
  if differences:
    raise UserError(
        f"{run.directory} holds a run with another config ({'; '.join(differences)}); choose "
        "another --workdir, or pass --allow_config_change to continue this run with the new "
        "config")
