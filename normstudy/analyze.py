"""Draw the figures and write the summary and observations of every run below a directory.

  python -m normstudy.analyze --workdir=DIR [--smoothing=0.8]

The library behind it is the package `normstudy.analysis` (import it in a notebook).
"""

from absl import flags

from normstudy import cli
from normstudy import errors

FLAGS = flags.FLAGS


def define_flags():
  from normstudy.analysis import DEFAULT_SMOOTHING
  flags.DEFINE_string("workdir", None, "Directory holding runs (searched recursively).")
  flags.DEFINE_float("smoothing", DEFAULT_SMOOTHING,
                     "EMA weight of the loss curves in [0, 1); 0 draws raw losses only.")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  from normstudy import analysis
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not 0.0 <= FLAGS.smoothing < 1.0:
    raise errors.UserError(f"--smoothing={FLAGS.smoothing} is outside [0, 1)")
  from normstudy.records import storage
  try:
    # gs://: the run files are read into a local stage, the outputs uploaded beside them.
    with storage.staged(FLAGS.workdir) as workdir:
      outputs = analysis.analyze(workdir, FLAGS.smoothing)
      outputs = {name: storage.remote(path) for name, path in outputs.items()}
  except analysis.NoRunsError as e:
    raise errors.UserError(str(e).replace(workdir, FLAGS.workdir)) from None
  for name, path in outputs.items():
    print(f"{name}: {path}")


if __name__ == "__main__":
  cli.run(main, define_flags)
