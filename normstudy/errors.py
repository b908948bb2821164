"""The ways a run stops on purpose, each reported as one line without a traceback.

Anything else that escapes is a bug, and keeps its traceback.
"""


class UserError(Exception):
  """Bad input: a config value, a path, a flag. Exit code 2; nothing was created or changed."""


class ConfigError(UserError, ValueError):
  """A config value outside what normstudy accepts (a ValueError too, for notebook callers)."""


class WorkdirBusy(UserError):
  """Another live process holds the workdir's lock."""


class RunHalted(Exception):
  """Training stopped on a non-finite step or a collapsed loss scale. Exit code 3; the newest
  checkpoint holds the last good state."""


class Preempted(Exception):
  """SIGTERM/SIGINT: the current step was finished and checkpointed. Exit code 0."""


def not_allowed(field: str, value, allowed) -> ConfigError:
  """The one message for a value outside its allowed set or range: names the field, the value
  and what is allowed (a description, or the allowed names)."""
  if not isinstance(allowed, str):
    allowed = ", ".join(str(a) for a in allowed)
  return ConfigError(f"config.{field}={value!r} is not allowed; allowed: {allowed}")
