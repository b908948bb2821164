"""Draw the comparison figure and the summary of every run below a directory.

  python -m normstudy.analyze --workdir=DIR [--smoothing=0.6]
"""

import os

from absl import flags

from normstudy import analysis
from normstudy import cli
from normstudy import errors

_WORKDIR = flags.DEFINE_string("workdir", None, "Directory holding runs (searched recursively).")
_SMOOTHING = flags.DEFINE_float("smoothing", analysis.DEFAULT_SMOOTHING,
                                "EMA weight of the loss curves in [0, 1); 0 draws raw losses only.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not os.path.isdir(_WORKDIR.value):
    raise errors.UserError(f"--workdir={_WORKDIR.value!r} is not a directory")
  if not 0.0 <= _SMOOTHING.value < 1.0:
    raise errors.UserError(f"--smoothing={_SMOOTHING.value} is outside [0, 1)")
  try:
    outputs = analysis.analyze(_WORKDIR.value, _SMOOTHING.value)
  except analysis.NoRunsError as e:
    raise errors.UserError(str(e)) from None
  for name, path in outputs.items():
    print(f"{name}: {path}")


if __name__ == "__main__":
  cli.run(main)
