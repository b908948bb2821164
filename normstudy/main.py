"""Train one run: python -m normstudy.main --config=configs/seed_figure.py:pre_norm_clip1 --workdir=DIR

Any config field can be overridden: --config.optimizer.clip_norm=10 --config.model.dtype=float32
"""

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags
from ml_collections import config_flags

from normstudy import errors

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file("config", None, "Config file[:variant].", lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory of the run (created; resumed if it exists).")
  flags.DEFINE_bool(
      "allow_config_change", False,
      "Continue a run in --workdir even if its saved config differs in model, optimizer or data.")
  flags.DEFINE_string("coordinator_address", None,
                      "host:port of process 0, for multi-process runs.")
  flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
  flags.DEFINE_integer("process_id", None, "This process's index, from 0.")
  cli.define_print_config_flag()
  flags.declare_key_flag("print_config")  # defined in normstudy.cli; listed in --help
  flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  from normstudy.core import config as config_lib
  config_lib.check_is_config(FLAGS.config, repr(config_flags.get_config_filename(
      FLAGS["config"]).split(":", 1)[0]))
  if FLAGS.print_config:
    print(cli.config_text(FLAGS.config))
    return
  from normstudy.records import storage
  storage.check_workdir(FLAGS.workdir)
  for line in cli.config_changes(FLAGS.config):
    print(line, flush=True)
  # The training stack (JAX, Flax, Orbax: a second to import) loads after the flags parsed:
  # a mistyped flag, config field or workdir URL is answered at once.
  import jax
  from normstudy.engine import sharding
  from normstudy.experiments import planning
  sharding.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                  FLAGS.process_id)
  # A gs:// workdir is worked in through a local stage (normstudy.records.storage).
  with storage.staged(FLAGS.workdir, writer=jax.process_index() == 0) as workdir:
    planning.train_and_evaluate(FLAGS.config, workdir, FLAGS.allow_config_change)
    line = finished_line(workdir, FLAGS.workdir)
  if jax.process_index() == 0:
    print(line, flush=True)


def finished_line(workdir: str, shown: str) -> str:
  """'finished: step 1000, loss 2.4881, eval loss 2.4880 (step 1000); records in DIR', from the
  run's records (also for a run that had finished before; a halted run ends with its own line,
  normstudy.errors.RunHalted)."""
  import math
  import os
  from normstudy.records import metrics as metrics_lib
  from normstudy.records import schema
  last, last_eval = {}, None
  for record in metrics_lib.read_records(os.path.join(workdir, schema.METRICS),
                                         skip_damaged=True):
    last = record
    if isinstance(record.get("eval_loss"), (int, float)):
      last_eval = record
  parts = [f"step {last.get('step', 0)}"]
  if isinstance(last.get("loss"), (int, float)) and math.isfinite(last["loss"]):
    parts.append(f"loss {last['loss']:.4f}")
  if last_eval is not None:
    parts.append(f"eval loss {last_eval['eval_loss']:.4f} (step {last_eval['step']})")
  return f"finished: {', '.join(parts)}; records in {shown}"


if __name__ == "__main__":
  cli.run(main, define_flags)
