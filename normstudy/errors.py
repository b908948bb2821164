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


class WorkerKilled(Exception):
  """A sweep's worker process died from a signal (a kill, the out-of-memory killer) or exited
  without a word: its program's runs continue from their newest checkpoints. Exit code 1."""


def not_allowed(field: str, value, allowed) -> ConfigError:
  """The one message for a value outside its allowed set or range: names the field, the value
  and what is allowed (a description, or the allowed names)."""
  if not isinstance(allowed, str):
    allowed = ", ".join(str(a) for a in allowed)
  return ConfigError(f"config.{field}={value!r} is not allowed; allowed: {allowed}")


_DISK_FULL = ("No space left on device", "os_error_code='28'", "[Errno 28]", "Disk quota exceeded",
              "File too large", "os_error_code='27'", "[Errno 27]")
_OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


def _chain(exc):
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    yield exc
    exc = exc.__cause__ or exc.__context__


def _is_disk_full(error: BaseException) -> bool:
  """Whether `error` itself says the disk or quota is full (errno, or the words of orbax's and
  tensorstore's messages)."""
  import errno
  # EFBIG: a file-size limit (ulimit -f) ends a write as a full disk does.
  return getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or any(
      marker in " ".join(str(error).split()) for marker in _DISK_FULL)


def disk_full(exc: BaseException) -> bool:
  """Whether a full disk or an exhausted quota is behind `exc` (anywhere in its chain)."""
  return any(_is_disk_full(error) for error in _chain(exc))


def environment_problem(exc: BaseException):
  """One line for a failure of the machine rather than of normstudy (a full disk, memory the
  model does not fit in, a read-only or forbidden path, a JAX_PLATFORMS it has no backend
  for), or None for anything else (a bug, which
  keeps its traceback). Looks through the exception's chain."""
  import errno
  import re
  for error in _chain(exc):
    text = " ".join(str(error).split())
    quoted = re.findall(r'"([^"]+)"', text)
    where = f" while writing {quoted[0]}" if quoted else (
        f" while writing {error.filename}" if getattr(error, "filename", None) else "")
    if _is_disk_full(error):
      return (f"disk full{where}; free space on that filesystem, then run the same command: "
              "it continues from the newest complete checkpoint")
    if getattr(error, "errno", None) in (errno.EROFS, errno.EACCES, errno.EPERM):
      return f"cannot write {error.filename or 'a file'}: {error.strerror}"
  for error in _chain(exc):
    text = " ".join(str(error).split())
    if isinstance(error, RuntimeError) and text.startswith("Unable to initialize backend"):
      import os
      asked = os.environ.get("JAX_PLATFORMS", "")
      jax_said = text.split(" (set JAX_PLATFORMS")[0].rstrip(".")
      return (f"{jax_said}; JAX_PLATFORMS={asked!r} asks for an accelerator this machine's "
              "jax cannot reach: unset it (jax chooses what there "
              "is), or install the accelerator's jax (pip install -e '.[gpu]' for CUDA)")
    if any(marker in text for marker in _OUT_OF_MEMORY):
      return (f"out of memory ({text[:160]}); the model, batch or sequence does not fit: reduce "
              "config.train.batch_size, config.model.max_len or the model's size, or use more "
              "devices")
  return None
