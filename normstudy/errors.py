"""The ways a run stops on purpose, each reported as one line without a traceback.

Anything else that escapes is a bug, and keeps its traceback.
"""


class UserError(Exception):
  """Bad input: a config value, a path, a flag. Exit code 2; nothing was created or changed."""


class RunHalted(Exception):
  """Training stopped on a non-finite step or a collapsed loss scale. Exit code 3; the newest
  checkpoint holds the last good state."""


class Preempted(Exception):
  """SIGTERM/SIGINT: the current step was finished and checkpointed. Exit code 0."""
