"""Draw the figures and write the summary and observations of every run below a directory.

  python -m normstudy.analyze --workdir=DIR [--smoothing=0.8] [--against=FIRST]

With --against=FIRST (both directories searches of the same arms and seeds, e.g. float16 and
bfloat16), also the interaction of the two: interaction.csv in DIR (normstudy.analysis.
interaction: does a ratio of critical learning rates in FIRST hold in DIR).
With --from_tables, a search's critical_lr.csv and critical_lr_tests.csv (and interaction.csv
with --against) are re-derived from its tables alone (critical_lr_points.csv and runs.csv): how
a committed search is re-analysed after its runs' records are gone.

The library behind it is the package `normstudy.analysis` (import it in a notebook).
"""

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags

from normstudy import errors

FLAGS = flags.FLAGS


# normstudy.analysis.plots.DEFAULT_SMOOTHING (tests/test_analysis.py checks they agree): the
# analysis stack takes seconds to import, which --help must not wait for.
DEFAULT_SMOOTHING = 0.8


def define_flags():
  flags.DEFINE_string("workdir", None, "Directory holding runs (searched recursively).")
  flags.DEFINE_float("smoothing", DEFAULT_SMOOTHING,
                     "EMA weight of the loss curves in [0, 1); 0 draws raw losses only.")
  flags.DEFINE_string("against", None,
                      "A search of the same arms and seeds in another setting (e.g. float16, "
                      "against --workdir's bfloat16): also write their interaction "
                      "(interaction.csv in --workdir).")
  flags.DEFINE_bool("from_tables", False,
                    "Re-derive a search's critical_lr.csv and critical_lr_tests.csv (and, with "
                    "--against, interaction.csv) from its committed tables, critical_lr_points.csv "
                    "and runs.csv, without its runs' records (e.g. docs/survival).")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not 0.0 <= FLAGS.smoothing < 1.0:
    raise errors.UserError(f"--smoothing={FLAGS.smoothing} is not allowed; allowed: a number "
                           "in [0, 1) (the EMA's weight of the past; 0: no smoothing)")
  from normstudy.records import storage
  storage.check_workdir(FLAGS.workdir)
  from normstudy import analysis  # pandas and matplotlib, once the command line is good
  if FLAGS.from_tables:
    _from_tables(analysis)
    return
  against = _search_directory(FLAGS.against) if FLAGS.against else None
  try:
    # gs://: the run files are read into a local stage, the outputs uploaded beside them.
    with storage.staged(FLAGS.workdir) as workdir:
      outputs = analysis.analyze(workdir, FLAGS.smoothing)
      if against is not None:
        if analysis.load_runs(workdir).search is None:
          raise errors.UserError(f"--against={FLAGS.against}: --workdir={FLAGS.workdir} holds "
                                 "no search (sweep.json without `search`) to compare with")
        outputs.update(analysis.interaction.analyze(against, workdir))
      outputs = {name: storage.remote(path) for name, path in outputs.items()}
  except analysis.NoRunsError as e:
    raise errors.UserError(str(e).replace(workdir, FLAGS.workdir)) from None
  for name, path in outputs.items():
    print(f"{name}: {path}")


def _from_tables(analysis) -> None:
  import os
  if not os.path.isdir(FLAGS.workdir):
    raise errors.UserError(f"--workdir={FLAGS.workdir} is not a directory")
  try:
    outputs = analysis.critical_lr.from_tables(FLAGS.workdir)
    if FLAGS.against:
      outputs.update(analysis.interaction.from_tables(FLAGS.against, FLAGS.workdir))
  except (analysis.NoRunsError, FileNotFoundError) as e:
    raise errors.UserError(str(e)) from None
  for name, path in outputs.items():
    print(f"{name}: {path}")


def _search_directory(path: str) -> str:
  """A local copy of the search directory `path` (gs:// is copied); UserError unless it holds
  a search."""
  import os
  from normstudy import analysis
  from normstudy.records import rundir
  from normstudy.records import schema
  local = analysis.localize(path)
  record = rundir.read_json(os.path.join(local, schema.SWEPT)) if os.path.isdir(local) else {}
  if not record.get("search"):
    raise errors.UserError(f"--against={path} holds no search (a sweep.json with `search`, "
                           "written by normstudy.sweep --search)")
  return local


if __name__ == "__main__":
  cli.run(main, define_flags)
