"""What every normstudy command shares: quiet library logs, and one line for a user's mistake."""

import logging as std_logging
import sys

from absl import app
from absl import logging


class UserError(Exception):
  """Bad input from the user: reported as one line, exit code 2, no traceback."""


# INFO lines from these packages drown the progress lines a researcher watches for.
_QUIET_PACKAGES = ("/orbax/", "/jax/", "/jaxlib/", "/tensorflow_datasets/", "/grain/", "/etils/")
_QUIET_MESSAGES = ("Using custom data configuration",)


class _LibraryNoise(std_logging.Filter):

  def filter(self, record):
    path = record.pathname.replace("\\", "/")
    if record.levelno < std_logging.WARNING and any(p in path for p in _QUIET_PACKAGES):
      return False
    return not any(m in str(record.msg) for m in _QUIET_MESSAGES)


def quiet_library_logs():
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _LibraryNoise) for f in handler.filters):
    handler.addFilter(_LibraryNoise())
  logging.set_verbosity(logging.INFO)


def run(main):
  """`absl.app.run(main)`, with library noise filtered and UserError turned into one line."""

  def wrapped(argv):
    quiet_library_logs()
    try:
      main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)

  app.run(wrapped)
