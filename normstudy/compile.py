"""Compile a config for a TPU topology ahead of time, on any machine, and say whether it fits:

  python -m normstudy.compile --config=configs/seed_figure.py:pre_norm_clip1 --topology=v5e:4x4 \\
      --config.model.num_layers=24 --config.mesh.fsdp=16 [--json]

The train step is compiled exactly as normstudy.main would compile it on those chips, with the
config's mesh (normstudy.engine.aot); printed per chip: the arguments (parameters, optimizer state
and the batch), the temporaries, their total against the chip's HBM (as the compiler states it),
FLOPs per step counted from the model and the compiler's, the collectives one step executes
(each op times its loops' trip counts) and those in the program, and the memory plan
(normstudy.engine.memory) beside them. Exit 0 when it fits, 1 with one line naming the shortfall
when it does not, 2 for a topology it does not know or no TPU compiler (`make tpu-aot`
installs one). v4 compiles as megacore (one device a chip, as a v4 TPU VM shows it).
"""

import json
import sys

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags
from ml_collections import config_flags

from normstudy import errors
from normstudy.engine import memory  # plain arithmetic: no training stack before the flags parse

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file("config", None, "Config file[:variant].", lock_config=True)
  flags.DEFINE_string("topology", None, "TPU topology, e.g. v5e:2x2, v5e:4x4, v4:2x2x4.")
  flags.DEFINE_bool("json", False, "Print the figures as one JSON object.")
  flags.mark_flags_as_required(["config", "topology"])


def _gib(n) -> str:
  return memory.human(n)


def _lines(c) -> list[str]:
  mesh = ", ".join(f"{k}={v}" for k, v in c.mesh.items())
  lines = [f"{c.topology}: {c.chips} x {c.device_kind}, mesh {mesh}",
           f"per chip: arguments {_gib(c.arguments)} (parameters {_gib(c.parameters)}, "
           f"optimizer state {_gib(c.optimizer_state)}, the batch and counters), "
           f"temporaries {_gib(c.temporaries)}, total {_gib(c.total)} of {_gib(c.hbm_bytes)} HBM "
           f"({'as the compiler states it' if c.hbm_source == 'compiler' else 'from a table'})",
           f"memory plan (normstudy.engine.memory): {c.plan.describe()}",
           f"FLOPs per step per chip: {c.flops_per_step:.3g}, counted from the model "
           "(normstudy.engine.memory.train_flops: every layer, the remat forward, attention); "
           "XLA's own cost analysis is not a step's count (it counts a loop's body once) and "
           "is only in --json, as xla_cost_analysis_flops"]
  for title, found in (("collectives per step", c.collectives_per_step),
                       ("collective ops in the program", c.collectives)):
    used = {op: v for op, v in found.items() if op != "loops_unknown" and v["count"]}
    lines.append(f"{title}: " + (", ".join(f"{op} {v['count']} ({_gib(v['bytes'])})"
                                           for op, v in used.items()) or "none"))
  if c.collectives_per_step.get("loops_unknown"):
    lines.append(f"  ({c.collectives_per_step['loops_unknown']} loop(s) without a stated trip "
                 "count counted once)")
  return lines


def main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  from normstudy.engine import aot
  aot.check_topology(FLAGS.topology)
  aot.prepare_tpu_compiler(FLAGS.topology)  # before JAX starts a backend
  from normstudy.experiments import validation
  validation.validate(FLAGS.config)
  compiled = aot.compile_for(FLAGS.config, aot.topology_devices(FLAGS.topology), FLAGS.topology)
  if FLAGS.json:
    print(json.dumps(compiled.as_json(), sort_keys=True))
  else:
    for line in _lines(compiled):
      print(line)
  if not compiled.fits:
    short = compiled.total - compiled.hbm_bytes
    print(f"does not fit: one chip needs {_gib(compiled.total)}, "
          f"{_gib(short)} more than its {_gib(compiled.hbm_bytes)} of HBM"
          + (" (the compiler refused it)" if compiled.error else ""), file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main, define_flags)
