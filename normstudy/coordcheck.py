"""The coordinate check: does a parametrization keep each layer's scale as the model widens?

  python -m normstudy.coordcheck --config=configs/ladder.py:pre_norm_clip1 \\
      --widths=16,32,64,128,256 [--parametrizations=sp,mup,umup] [--learning_rates=...] \\
      [--steps=10] [--workdir=DIR]

For each parametrization and width (d_ff 4x, heads --head_dim wide, u-muP with an untied head) the
config's model is trained --steps steps at a constant rate on one fixed batch of random tokens;
after each step the RMS of every block's output and of the logits, and of their change since
initialisation, is recorded (normstudy.experiments.coordinates; the `mup` package's coord check).
Writes DIR/coordcheck.csv (parametrization, width, step, layer, quantity, rms),
DIR/coordcheck.png (normstudy.analysis.coordinates_figure) and DIR/coordcheck.json (the command
and each parametrization's rate).
"""

import os
import time

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags
from ml_collections import config_flags

from normstudy import errors
from normstudy.core import parametrizations  # the registry alone: it imports only its records

FLAGS = flags.FLAGS
NAMES = parametrizations.NAMES


def define_flags():
  config_flags.DEFINE_config_file("config", None, "Config file[:variant] whose model is widened.",
                                  lock_config=False)
  flags.DEFINE_string("workdir", "runs/coordcheck", "Where coordcheck.csv and .png go.")
  flags.DEFINE_list("widths", ["16", "32", "64", "128", "256"], "d_model of each model.")
  flags.DEFINE_list("parametrizations", ["sp", "mup", "umup"], "Which to check.")
  flags.DEFINE_list("learning_rates", None, "One constant rate per parametrization (default: "
                    "the config's for each, times 100 for umup, whose hidden rates are "
                    "lr / sqrt(fan_in) on unit-scale weights).")
  flags.DEFINE_integer("steps", 10, "Train steps after initialisation.")
  flags.DEFINE_integer("head_dim", 16, "Each head's width (heads are added as the model widens).")
  flags.DEFINE_bool("print_rules", False, "Print each parametrization's per-parameter rules at "
                    "each width (role, fan-in, initial RMS, forward multiplier, learning-rate "
                    "and epsilon factors; the attention and activation scales) and train "
                    "nothing: what to compare with `mup`'s or unit_scaling's own.")
  flags.mark_flags_as_required(["config"])


def _numbers(name, texts, kind, least):
  try:
    values = [kind(t) for t in texts]
  except ValueError:
    values = None
  if not values or any(v < least for v in values):
    raise errors.UserError(f"--{name}={','.join(texts)} is not allowed; allowed: a "
                           f"comma-separated list of {kind.__name__}s >= {least}")
  return values


PARTIAL = "coordcheck_partial.csv"  # the rows measured so far
PARTIAL_COMMAND = "coordcheck_partial.command"  # the command they belong to


def main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  widths = _numbers("widths", FLAGS.widths, int, 1)
  unknown = [p for p in FLAGS.parametrizations if p not in NAMES]
  if unknown or not FLAGS.parametrizations:
    raise errors.UserError(f"--parametrizations={','.join(FLAGS.parametrizations)} is not "
                           f"allowed; allowed: a comma-separated list of {', '.join(NAMES)}")
  config = FLAGS.config
  if FLAGS.learning_rates is None:
    lrs = [config.optimizer.learning_rate * parametrizations.get(p).rate_scale
           for p in FLAGS.parametrizations]
  else:
    lrs = _numbers("learning_rates", FLAGS.learning_rates, float, 0.0)
    if len(lrs) != len(FLAGS.parametrizations):
      raise errors.UserError(f"--learning_rates gives {len(lrs)} rates for "
                             f"{len(FLAGS.parametrizations)} parametrizations; give one each")
  for name, value in (("steps", FLAGS.steps), ("head_dim", FLAGS.head_dim)):
    if value < 1:
      raise errors.UserError(f"--{name}={value} is not allowed; allowed: an integer >= 1")
  uneven = [w for w in widths if w > FLAGS.head_dim and w % FLAGS.head_dim]
  if uneven:  # heads of width // head_dim would be wider than asked
    raise errors.UserError(f"--head_dim={FLAGS.head_dim} does not divide --widths "
                           f"{', '.join(map(str, uneven))}; allowed: a head width that divides "
                           "every width above it (heads are head_dim wide)")
  from normstudy.experiments import coordinates
  from normstudy.experiments import validation
  for p, lr in zip(FLAGS.parametrizations, lrs):
    for width in widths:
      validation.validate(coordinates.width_config(config, p, width, FLAGS.head_dim, lr))
  if FLAGS.print_rules:
    for p, lr in zip(FLAGS.parametrizations, lrs):
      for width in widths:
        print(rules_text(coordinates.width_config(config, p, width, FLAGS.head_dim, lr)))
    return
  from normstudy.records import rundir
  rundir.check_writable(FLAGS.workdir, "--workdir")
  import pandas as pd
  from normstudy.analysis import coordinates_figure
  from normstudy.analysis.plots import save
  import json
  import shlex
  import sys
  command = " ".join(["python -m normstudy.coordcheck", *map(shlex.quote, sys.argv[1:])])
  rows = _measure_resumably(config, lrs, widths, command, pd, coordinates)
  order = {(p, w): i for i, (p, w) in enumerate(
      (p, w) for p in FLAGS.parametrizations for w in widths)}
  rows.sort(key=lambda r: order[(r["parametrization"], int(r["width"]))])  # stable: steps stay
  table = pd.DataFrame(rows, columns=coordinates.COLUMNS)
  path = os.path.join(FLAGS.workdir, "coordcheck.csv")
  table.to_csv(path, index=False)
  with open(os.path.join(FLAGS.workdir, "coordcheck.json"), "w", encoding="utf-8") as f:
    json.dump({"command": command,
               "learning_rates": dict(zip(FLAGS.parametrizations, lrs))}, f, indent=2)
  os.remove(os.path.join(FLAGS.workdir, PARTIAL))
  os.remove(os.path.join(FLAGS.workdir, PARTIAL_COMMAND))
  figure = os.path.join(FLAGS.workdir, "coordcheck.png")
  save(coordinates_figure.figure(table), figure)
  print(f"coordcheck: {path}\nfigure: {figure}")


def _measure_resumably(config, lrs, widths, command: str, pd, coordinates) -> list:
  """Every (parametrization, width)'s rows, each kept in --workdir's PARTIAL as it is measured:
  an interrupted check resumes where it stopped (once it kept nothing until the end). UserError
  for a partial check of another command."""
  partial = os.path.join(FLAGS.workdir, PARTIAL)
  partial_of = os.path.join(FLAGS.workdir, PARTIAL_COMMAND)
  rows = []
  if os.path.exists(partial):
    with open(partial_of, encoding="utf-8") as f:
      before = f.read().strip()
    if before != command:
      raise errors.UserError(f"--workdir={FLAGS.workdir} holds a partial coordinate check of "
                             f"another command ({before}); run that one to finish it, or "
                             "choose another --workdir")
    rows = pd.read_csv(partial).to_dict("records")
  measured = {(r["parametrization"], int(r["width"])) for r in rows}
  todo = [(p, lr, w) for p, lr in zip(FLAGS.parametrizations, lrs) for w in widths
          if (p, w) not in measured]
  if measured:
    print(f"[coordcheck] resuming: {len(measured)} of {len(measured) + len(todo)} "
          f"(parametrization, width) pairs measured before", flush=True)
  os.makedirs(FLAGS.workdir, exist_ok=True)
  with open(partial_of, "w", encoding="utf-8") as f:
    f.write(command + "\n")
  start, done, total = time.monotonic(), 0, len(todo)
  for p, lr, width in todo:
    rows += coordinates.measure(config, p, [width], FLAGS.steps, lr, FLAGS.head_dim)
    pd.DataFrame(rows, columns=coordinates.COLUMNS).to_csv(partial + ".tmp", index=False)
    os.replace(partial + ".tmp", partial)
    done += 1
    spent = time.monotonic() - start
    print(f"[coordcheck] {p} at width {width}: {done}/{total} | {spent:.0f}s | ETA "
          f"{spent / done * (total - done):.0f}s", flush=True)
  return rows


def rules_text(config) -> str:
  """The per-parameter rules of one config's model (normstudy.core.model.parameter_rules) as a
  table, headed by the model's size, base and its whole-model scales."""
  from normstudy.core import model as model_lib
  model = config.model
  cfg = model_lib.ModelConfig.create(model)
  scale = parametrizations.attention_scale(cfg)
  head_dim = model.d_model // model.num_heads
  lines = [f"{model.parametrization} at width {model.d_model} (base_width {model.base_width}, "
           f"{model.num_layers} layers, base_depth {model.base_depth}, heads {head_dim} wide): "
           f"attention q.k x {scale if scale is not None else head_dim ** -0.5:.6g}, attention "
           f"output x {parametrizations.attention_output_multiplier(cfg):.6g}, activation x "
           f"{parametrizations.activation_multiplier(cfg):.6g}",
           f"  {'parameter':<44} {'shape':<16} {'role':<9} {'fan_in':>6} {'block':>5} "
           f"{'init rms':>9} {'forward':>9} {'lr x':>9} {'eps x':>9}"]
  for r in model_lib.parameter_rules(model):
    lines.append(f"  {r['path']:<44} {str(r['shape']):<16} {r['role']:<9} {r['fan_in']:>6} "
                 f"{'yes' if r['in_block'] else 'no':>5} {r['init_rms']:>9.4g} "
                 f"{r['forward']:>9.4g} {r['lr']:>9.4g} {r['eps']:>9.4g}")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run(main, define_flags)
