"""normstudy: which block design and which clipping keep a transformer run alive, and at what cost."""

import os
import signal
import sys

# TensorFlow is only used to write TensorBoard event files (clu) and, for gs:// paths, gfile.
# Without these it prints two lines at import (an absl pre-init warning and a oneDNN notice):
# noise a researcher would have to learn to ignore. Set before any TensorFlow import.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

# Ctrl-C at any point of a command is one line and exit 130 (normstudy.cli). A command's own
# handling starts once its module has imported jax, flax and the rest, about a second; until
# then `python -m normstudy.<command>` (argv[0] is "-m" while its package imports) stops here.
INTERRUPTED = ("interrupted (Ctrl-C): stopped; a run continues from its last checkpoint with "
               "the same command")


def _interrupted_while_importing(signum, frame):
  # os._exit, not sys.exit: SystemExit raised inside a library's import can be caught there
  # (an `except BaseException` around an optional import) and the command would go on; nothing
  # has been written yet, so there is nothing to clean up.
  del signum, frame
  print(INTERRUPTED, file=sys.stderr, flush=True)
  os._exit(130)


if sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
  signal.signal(signal.SIGINT, _interrupted_while_importing)


def __getattr__(name):
  # Config files written before the layers became packages (2026-12) import the schema as
  # `from normstudy import config`; it lives in normstudy.core.config now.
  if name == "config":
    from normstudy.core import config
    return config
  raise AttributeError(f"module 'normstudy' has no attribute {name!r}")
