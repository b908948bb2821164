"""What every normstudy command shares: quiet library logs, and one line for a user's mistake.

Entry modules (main, study, sweep, analyze) define their absl flags in a `define_flags()` that
only runs when the module is the program, so any of them can be imported together (a notebook,
a test) without duplicate-flag errors.
"""

import os
import signal
import sys

# TensorFlow writes TensorBoard event files (clu) and reads gs:// paths (gfile); without these,
# set before anything imports it, it prints an absl pre-init warning and a oneDNN notice at
# import: noise a researcher would have to learn to ignore.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

INTERRUPTED = ("interrupted (Ctrl-C): stopped; a run continues from its last checkpoint with "
               "the same command")


def _interrupted_while_importing(signum, frame):
  # os._exit, not sys.exit: SystemExit raised inside a library's import can be caught there
  # (an `except BaseException` around an optional import) and the command would go on; nothing
  # has been written yet, so there is nothing to clean up.
  del signum, frame
  print(INTERRUPTED, file=sys.stderr, flush=True)
  os._exit(130)


def _stop_on_ctrl_c_while_importing() -> None:
  """Ctrl-C at any point of a command is one line and exit 130. Every command imports this
  module first; from here until `run` takes over, Ctrl-C (while absl, ml_collections and the
  rest import) stops the process with that line. Only in a command's process (`python -m
  normstudy.<command>`), never where normstudy is imported as a library."""
  main = getattr(sys.modules.get("__main__"), "__spec__", None)
  if (main is not None and main.name.startswith("normstudy.")
      and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
    signal.signal(signal.SIGINT, _interrupted_while_importing)


_stop_on_ctrl_c_while_importing()

# pylint: disable=wrong-import-position  (the handler above first: these take a tenth of a second)
import re  # noqa: E402
import traceback  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from normstudy import errors  # noqa: E402
from normstudy.core import experiment  # noqa: E402
from normstudy.engine.logs import quiet_library_logs  # noqa: E402
from normstudy.errors import Preempted  # noqa: E402
from normstudy.errors import RunHalted  # noqa: E402
from normstudy.errors import UserError  # noqa: E402
from normstudy.errors import WorkerKilled  # noqa: E402
from normstudy.experiments import workers  # noqa: E402
from normstudy.records import schema  # noqa: E402


def define_workers_flag():
  flags.DEFINE_integer(
      "workers", 0, "Programs trained at a time, each in a worker process on an equal share of "
      "the cores (0: one per core, up to one per program; 1: one after another in this "
      "process). The runs' bits do not depend on it.")


def define_print_config_flag():
  flags.DEFINE_bool("print_config", False,
                    "Print the resolved config (every field, as config.json will hold it) and "
                    "exit without training.")


def config_text(config) -> str:
  """The resolved config as config.json holds it (sorted, indented JSON), once it passes the
  checks a run makes (normstudy.experiments.validation: UserError otherwise)."""
  import json
  from normstudy.experiments import validation
  from normstudy.records import rundir
  validation.validate(config)
  return json.dumps(rundir.config_json(config), indent=2, sort_keys=True)


def runs_config_text(runs) -> str:
  """{run name: its resolved config} of a grid's runs, as each run's config.json will hold it,
  every one checked as a run would check it."""
  import json
  from normstudy.experiments import validation
  from normstudy.records import rundir
  for run in runs:
    validation.validate(run.config)
  return json.dumps({run.name: rundir.config_json(run.config) for run in runs}, indent=2,
                    sort_keys=True)


def _changed_fields(config, leave_out=()) -> dict:
  """{dotted field: value} of every field whose resolved value differs from normstudy.core.config's
  defaults (the variant's recipe and the command line's overrides together)."""
  from normstudy.core import config as config_lib
  from normstudy.records import rundir
  defaults = rundir.flatten(rundir.config_json(config_lib.default_config()))
  return {k: v for k, v in rundir.flatten(rundir.config_json(config)).items()
          if k not in leave_out and (k not in defaults or defaults[k] != v)}


def config_changes(config) -> list[str]:
  """Lines naming every field that differs from the defaults (_changed_fields)."""
  changed = _changed_fields(config)
  return [f"config: {len(changed)} field(s) differ from the defaults (--print_config shows "
          "all):"] + [f"  {k}={v!r}" for k, v in sorted(changed.items())]


def grid_config_changes(runs, varied) -> list[str]:
  """config_changes for a grid's arms: the fields every arm changes from the defaults alike,
  then each arm's own, leaving out the fields the grid varies (`varied`: axes, a searched
  field)."""
  first_runs = {}
  for run in runs:
    first_runs.setdefault(run.arm or run.name, run)
  varied = {*varied, "label"}  # a run's label names its point
  changed = {arm: _changed_fields(run.config, varied) for arm, run in first_runs.items()}
  common = {k: v for k, v in next(iter(changed.values()), {}).items()
            if all(other.get(k, object()) == v for other in changed.values())}
  lines = [f"config: {len(common)} field(s) differ from the defaults in every arm "
           "(--print_config shows all):"] + [f"  {k}={v!r}" for k, v in sorted(common.items())]
  for arm, fields in changed.items():
    own = {k: v for k, v in fields.items() if k not in common}
    if own:
      lines.append(f"  arm {arm}: " + ", ".join(f"{k}={v!r}" for k, v in sorted(own.items())))
  return lines


def check_workers(requested: int) -> None:
  """UserError for a negative --workers; a warning line for more than the cores (the workers
  are capped at one per core: normstudy.experiments.workers.count)."""
  if requested < 0:
    raise UserError(f"--workers={requested} is not allowed; allowed: 0 (one per core, up to one "
                    "per program) or an integer >= 1")
  cores = len(os.sched_getaffinity(0))
  if requested > cores:
    print(f"warning: --workers={requested} is more than this machine's {cores} cores: at most "
          f"{cores} workers train, one per core", file=sys.stderr, flush=True)


def flag_error_line(error: Exception, argv) -> str:
  """One line for a flag-parsing failure (config_flags reports config-file errors with the
  file's whole traceback inside the message, and an unknown section as a KeyError repr)."""
  text = str(error)
  suggestion = re.search(r'Did you mean \\?"([^"\\]+)\\?" instead of \\?"([^"\\]+)\\?"', text)
  if suggestion:
    overrides = [a for a in argv[1:] if f".{suggestion[2]}." in a or f".{suggestion[2]}=" in a]
    return (f"unknown config field {suggestion[2]!r}"
            + (f" ({overrides[0]})" if overrides else "") + f"; did you mean {suggestion[1]!r}?")
  if isinstance(error, AttributeError) or "AttributeError" in text:
    name = re.findall(r"'([^']+)'", text)
    overrides = [a for a in argv[1:] if name and f".{name[-1]}=" in a]
    return (f"unknown config field {name[-1]!r}" if name else "unknown config field") + (
        f" ({overrides[0]})" if overrides else "")
  typed = _typed_value_line(text, argv)
  if typed is not None:
    return typed
  spec = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), "")
  if "get_config() takes 0 positional arguments" in text and ":" in spec:
    path, variant = spec.split(":", 1)
    return (f"get_config() of {path!r} takes no variant; drop ':{variant}' from --config={spec}, "
            "or give get_config a variant argument")
  cast = _CAST.search(text)
  if cast:  # ml_collections' words (1.1) for a value of another type set in a config file
    kind = _TYPE_WORDS.get(cast[4], f"a {cast[4]}")
    return (f"{cast[1]}={cast[2]!r} is not allowed; allowed: {kind} (a {cast[3]} was given"
            + (f", --config={spec})" if spec else ")"))
  users = _users_frame(error)
  if users is not None:
    return users
  # The last exception line of the file's traceback, its class qualified or not
  # ("normstudy.errors.ConfigError: unknown config field 'model.x'" is one too).
  raised = [line.strip() for line in text.splitlines() if re.match(r"\s*[\w.]+Error: ", line)]
  if isinstance(error, SyntaxError) or (raised and re.match(r"(SyntaxError|IndentationError|"
                                                            r"TabError): ", raised[-1])):
    why = (f"{error.msg} (line {error.lineno})" if isinstance(error, SyntaxError)
           else raised[-1].split(": ", 1)[1])
    return f"config file {spec.split(':', 1)[0]!r} is not valid Python: {why} (--config={spec})"
  if raised:
    reason = raised[-1].split("Error: ", 1)[1]
    return reason + (f" (--config={spec})" if "parsing config file" in text and spec else "")
  return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def _users_frame(error: Exception):
  """'KeyError 'v' in configs/x.py:6 (get_config)' for a bug raised in the user's own config
  file (not a ValueError, which config files raise on purpose for a bad variant), else None."""
  if isinstance(error, ValueError):
    return None
  frames = [frame for frame in traceback.extract_tb(error.__traceback__)
            if not any(part in frame.filename for part in ("site-packages", "/normstudy/",
                                                            "<frozen"))]
  if not frames:
    return None
  frame = frames[-1]
  return (f"{type(error).__name__} {error} in {os.path.relpath(frame.filename)}:{frame.lineno} "
          f"({frame.name})")


def _missing_config_file(argv):
  """A config file that cannot be a config, in one line (config_flags defers a missing file's
  error to the first use of the config, as a traceback, and words the others in Python)."""
  for arg in argv[1:]:
    if arg.startswith("--config="):
      spec = arg.split("=", 1)[1]
      path = spec.split(":", 1)[0]
      if os.path.isdir(path):
        return (f"config file {path!r} is a directory (--config={spec}); allowed: a Python "
                "file defining get_config(), e.g. configs/seed_figure.py")
      if not os.path.isfile(path):
        return f"config file {path!r} does not exist (--config={spec})"
      try:
        with open(path, encoding="utf-8") as f:
          source = f.read()
      except OSError as e:
        return f"config file {path!r} cannot be read: {e.strerror} (--config={spec})"
      except UnicodeDecodeError:
        return f"config file {path!r} is not UTF-8 Python source (--config={spec})"
      if not _defines(source, "get_config"):
        return (f"config file {path!r} defines no get_config(); a config file's "
                "get_config(variant) returns its ml_collections.ConfigDict")
  return None


def _defines(source: str, name: str) -> bool:
  """Whether Python `source` defines or imports `name` at its top level (a file that does not
  parse is left to config_flags, whose error names the line)."""
  import ast
  try:
    tree = ast.parse(source)
  except SyntaxError:
    return True
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
      return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      if any(isinstance(t, ast.Name) and t.id == name for t in targets):
        return True
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      if any((alias.asname or alias.name) == name or alias.name == "*" for alias in node.names):
        return True
  return False


_NOT_INT = re.compile(r"flag (--config\.[\w.]+)=(.*): invalid literal for int\(\) with base 10")
_NOT_BOOL = re.compile(r"flag (--config\.[\w.]+)=(.*): \('Non-boolean argument to boolean flag'")
_CAST = re.compile(r"Could not override field '(\w+)' \(reference\)\. (.*) is of original type "
                   r"<class '(\w+)'> and cannot be casted to type <class '(\w+)'>")
_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false",
               "str": "a string"}
_NOT_FLOAT = re.compile(r"flag (--config\.[\w.]+)=(.*): could not convert string to float")


_FLAG_NOT_NUMBER = re.compile(r"flag (--\w+)=(.*): (?:invalid literal for (int\(\))|could not "
                              r"convert string to (float))")


_INTEGRAL_FLOAT = re.compile(r"^(--config\.[\w.]+)=(\d+(?:\.\d*)?[eE]\+?\d+|\d+\.0*)$")


def _integral_override(arg: str) -> str:
  """--config.train.num_steps=1e3 (or 1000.0, as people write step counts) as =1000, which an
  integer field parses and a float field reads as the same number. A text field given such a
  value gets the integer's digits."""
  match = _INTEGRAL_FLOAT.match(arg)
  if not match:
    return arg
  number = float(match[2])
  return f"{match[1]}={int(number)}" if number.is_integer() and number < 2**63 else arg


def _typed_value_line(text: str, argv):
  """One plain line for a value of the wrong type, or None."""
  match = _NOT_INT.search(text)
  if match:
    return (f"{match[1]}={match[2]} is not allowed; allowed: an integer "
            f"({match[1][2:]} is one)")
  match = _NOT_BOOL.search(text)
  if match:
    return f"{match[1]}={match[2]} is not allowed; allowed: true or false"
  match = _NOT_FLOAT.search(text)
  if match:  # not Python's "could not convert string to float: 'None'"
    return (f"{match[1]}={match[2]} is not allowed; allowed: a number "
            f"({match[1][2:]} is one)")
  match = _FLAG_NOT_NUMBER.search(text)
  if match:  # a command's own flag (--workers=2.5, --rounds=x)
    kind = "an integer" if match[3] == "int()" else "a number"
    return f"{match[1]}={match[2]} is not allowed; allowed: {kind}"
  if "--config must have a value other than None" in text:
    spec = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), "")
    if not spec:
      return ("--config=FILE[:VARIANT] is required, e.g. "
              "--config=configs/seed_figure.py:pre_norm_clip1")
    return (f"get_config() of {spec.split(':', 1)[0]!r} returned None (--config={spec}); it "
            "must return an ml_collections.ConfigDict")
  return None


_HELP = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def _none_to_off(arg: str) -> str:
  name, _, value = arg.partition("=")
  if name in _NONE_MEANS and value.lower() in ("none", "off"):
    return f"{name}={_NONE_MEANS[name]}"
  return arg


# Fields the command line may switch off with None (config_flags cannot parse None for a float):
# the value that means "off".
_NONE_MEANS = {"--config.optimizer.clip_norm": "0"}


def _repeated_overrides(argv) -> list:
  """A line per config field given more than once on the command line (`--config.a.b=1 ...
  --config.a.b=2`): the last wins, as absl has it, but no longer without a word."""
  seen, lines = {}, []
  for arg in argv[1:]:
    if arg == "--":
      break
    if arg.startswith("--config.") and "=" in arg:
      name, value = arg[2:].split("=", 1)
      if name in seen and seen[name] != value:
        lines.append(f"--{name} is given twice ({seen[name]!r}, then {value!r}): the last wins")
      seen[name] = value
  return lines


def _parse_flags(argv):
  argv = [_none_to_off(arg) for arg in argv]
  asked = [arg for arg in argv[1:] if arg in _HELP]
  if asked:  # absl exits 1 after printing help; asking for help is not an error
    app.usage(shorthelp=asked[0] != "--helpfull", writeto_stdout=True, exitcode=0)
  missing = _missing_config_file(argv)
  if missing:
    print(f"error: {missing}", file=sys.stderr)
    sys.exit(2)
  argv = [_integral_override(arg) for arg in argv]
  # ml_collections' config_flags (1.1) loads --config's file as the module "config_config"
  # (SourceFileLoader.load_module), which re-executes a file into the module already there and
  # keeps the globals an earlier command's file defined; a command's file is loaded fresh
  # (normstudy.experiments.grid reads the EXPERIMENT of this module rather than load it again).
  sys.modules.pop(experiment.CONFIG_MODULE, None)
  try:
    parsed = flags.FLAGS(argv)
  except SystemExit as e:  # a config file that exits while it is loaded trained nothing
    spec = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), "?")
    print(f"error: config file {spec.split(':', 1)[0]!r} exited (code {e.code!r}) while it was "
          "loaded; a config file defines get_config() and returns its config", file=sys.stderr)
    sys.exit(2)
  except Exception as e:  # a flag or config-file mistake: one line, no traceback
    print(f"error: {flag_error_line(e, argv)}", file=sys.stderr)
    sys.exit(2)
  _check_workdir_flag()
  for line in _repeated_overrides(argv):  # scripts append overrides: said, not refused
    print(f"warning: {line}", file=sys.stderr)
  return parsed


def _check_workdir_flag() -> None:
  """--workdir as the shell would have read it: `~` expanded (once a directory named `~`), and
  one line for a path with a line break in it."""
  if "workdir" not in flags.FLAGS or flags.FLAGS.workdir is None:
    return
  given = flags.FLAGS.workdir
  if isinstance(given, list):  # a command that takes several (normstudy.forecast)
    flags.FLAGS.workdir = [_checked_workdir(workdir) for workdir in given]
  else:
    flags.FLAGS.workdir = _checked_workdir(given)


def _checked_workdir(workdir: str) -> str:
  """One --workdir value, `~` expanded; exit 2 with one line for one that names no path."""
  if not workdir.strip():
    print(f"error: --workdir={workdir!r} names no directory; allowed: a new or empty "
          "directory, one normstudy wrote, or gs://BUCKET/PATH", file=sys.stderr)
    sys.exit(2)
  if "\n" in workdir or "\r" in workdir:
    print(f"error: --workdir={workdir!r} holds a line break; allowed: a path on one line",
          file=sys.stderr)
    sys.exit(2)
  if any(ord(c) < 32 or ord(c) == 127 for c in workdir):
    print(f"error: --workdir={workdir!r} holds a control character; allowed: a path of "
          "printable characters", file=sys.stderr)
    sys.exit(2)
  return os.path.expanduser(workdir) if workdir.startswith("~") else workdir


# XLA programs compiled by a command are kept on disk and reused by later processes: a search's
# rounds, a sweep's workers and a resumed run train programs of the same shape as before, and on
# 2 CPU cores compiling one (about 20 s) costs as much as training a round's runs of it. The
# cache returns the same executable, so records are bit-equal with and without it (checked for
# a search of 2 rounds, 2026-12-01, jax 0.10.2). JAX_COMPILATION_CACHE_DIR chooses another
# directory; JAX_ENABLE_COMPILATION_CACHE=false turns it off. One directory per number of cores
# this process may use: XLA:CPU fixes its thread pool's size when a client starts and its
# programs' last bits follow it, while jax's cache key leaves it out, so a home directory shared
# by machines of other sizes must not hand one machine's programs to another.
#
# The size cap (jax's LRU eviction) comes with normstudy's own directory only. jax 0.10.2's LRU
# cache keeps an "-atime" file beside each entry and, before each write, reads every entry's;
# an entry written by a process without a cap has none, and from then on every capped write
# in that directory fails ("Error writing persistent compilation cache entry ...:
# FileNotFoundError", jax-ml/jax#39880, fixed by jax-ml/jax#39883 after 0.10.2). A directory
# the user chose (JAX_COMPILATION_CACHE_DIR) may be shared with their other JAX programs, and
# the tests' in-process programs share theirs: there normstudy sets no cap unless
# JAX_COMPILATION_CACHE_MAX_SIZE does.
COMPILE_CACHE_ENV = {
    "JAX_COMPILATION_CACHE_DIR": os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "normstudy", "xla", f"cpus{len(os.sched_getaffinity(0))}"),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1",  # cheap programs are not worth a file
    "JAX_COMPILATION_CACHE_MAX_SIZE": str(4 * 2**30),  # least recently used files go first
}


def use_compile_cache() -> None:
  """Puts COMPILE_CACHE_ENV's defaults in the environment (so worker processes inherit them)
  and, when jax is already imported, into its config; the size cap only when the directory is
  normstudy's own (the comment above COMPILE_CACHE_ENV says why)."""
  own_directory = "JAX_COMPILATION_CACHE_DIR" not in os.environ
  for name, value in COMPILE_CACHE_ENV.items():
    if name != "JAX_COMPILATION_CACHE_MAX_SIZE" or own_directory:
      os.environ.setdefault(name, value)
  if "jax" in sys.modules:
    import jax
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
    if "JAX_COMPILATION_CACHE_MAX_SIZE" in os.environ:
      jax.config.update("jax_compilation_cache_max_size",
                        int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"]))


def run(main, define_flags):
  """Defines the entry's flags, then `absl.app.run(main)` with library noise filtered; the stops
  of normstudy.errors become one line on stderr and an exit code (user error 2, halted run 3,
  preemption 0, a sweep's worker killed 1). Compiled programs are cached on disk
  (use_compile_cache)."""
  # From here Ctrl-C is a KeyboardInterrupt again, handled below (normstudy/__init__.py stops
  # the imports before this in the same line).
  signal.signal(signal.SIGINT, signal.default_int_handler)
  workers.stop_with_parent()  # a ladder's or drift's stage: never an orphan
  use_compile_cache()
  define_flags()

  def wrapped(argv):
    quiet_library_logs()
    try:
      schema.figure_formats()  # checked before anything is written
      main(argv)
      # The work is done: a Ctrl-C while the interpreter tears down (XLA's gc callback) would
      # print a stray KeyboardInterrupt and still exit 0; it is ignored from here.
      signal.signal(signal.SIGINT, signal.SIG_IGN)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    except RunHalted as e:
      print(f"halted: {e}", file=sys.stderr)
      sys.exit(3)
    except Preempted as e:
      print(f"preempted: {e}", file=sys.stderr)
      sys.exit(0)
    except WorkerKilled as e:
      print(f"stopped: {e}", file=sys.stderr)
      sys.exit(1)
    except KeyboardInterrupt:  # outside training, whose loop checkpoints on SIGINT itself
      _interrupted()
    except Exception as e:  # the machine's failures are one line; anything else is a bug
      line = errors.environment_problem(e)
      if line is None:
        raise
      print(f"error: {line}", file=sys.stderr)
      sys.exit(2)

  quiet_library_logs()  # from the start: a config file's loading logs through libraries too
  try:
    app.run(wrapped, flags_parser=_parse_flags)
  except KeyboardInterrupt:  # while the flags parse or the config file loads
    _interrupted()


def _interrupted() -> None:
  """Ctrl-C at any point of a command: one line and exit 130 (a shell's 128 + SIGINT), never
  a traceback."""
  print(INTERRUPTED, file=sys.stderr)
  sys.exit(130)
