"""What trained masked-prediction models take from context beyond a window.

  python -m normstudy.context_gap --workdir=DIR [--window=2]

For every finished run below DIR (an encoder: masked prediction), its evaluation rows' masked
segments are predicted twice: on the intact row, and on a row whose tokens beyond --window
positions of the segment come from another document (normstudy.data.splice). Writes
context_gap_rows.csv (per run and row), context_gap.csv (per run: the losses, the gap, its tests
over rows) and context_gap_tests.csv (per arm, and each pair of arms paired by seed) into DIR.
A model without attention sees only its position convolution's 5-token window: at --window=2
its gap is 0 up to float32 rounding, the control.
"""

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags

from normstudy import errors

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "Directory holding finished runs (searched recursively).")
  flags.DEFINE_integer("window", 2, "Tokens kept on each side of a predicted segment.")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  import os
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.window < 0:
    raise errors.UserError(f"--window={FLAGS.window}: it must be an integer >= 0")
  if not os.path.isdir(FLAGS.workdir):
    raise errors.UserError(f"--workdir={FLAGS.workdir} is not a directory")
  from normstudy.analysis import context_gap_report as analysis
  from normstudy.experiments import context_gap_runs
  outputs = {"context_gap_rows": context_gap_runs.write_rows(FLAGS.workdir, FLAGS.window)}
  outputs.update(analysis.analyze(FLAGS.workdir))
  for name, path in outputs.items():
    print(f"{name}: {path}")


if __name__ == "__main__":
  cli.run(main, define_flags)
