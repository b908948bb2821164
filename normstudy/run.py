"""Run any experiment by its kind: the one command behind every make target of an experiment.

  python -m normstudy.run --config=configs/ladder.py --workdir=runs/ladder [--workers=N]
  python -m normstudy.run --config=configs/seed_figure.py --workdir=DIR --study

The config file's EXPERIMENT (normstudy.core.experiment) says what runs, by its `kind`:
  ladder      normstudy.ladder: every rung's sweep, then the fits;
  drift       normstudy.drift: the fit, the prediction, the held-out stage, the analysis;
  techniques  normstudy.sweep, then normstudy.techniques against the declared baselines;
  grid        normstudy.sweep when it has axes, a search or parts, else normstudy.study; with
              --study, normstudy.study (the file's study arms at its seeds) whatever it has.
Then each of its `then` commands ("{workdir}" filled in). Each stage is its own process, as
the command prints it: one can be re-run alone, and re-running this resumes where it stopped
(finished stages train nothing again). SIGTERM reaches the running stage, which checkpoints.
"""

import os
import shlex
import sys

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags

from normstudy import errors

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("config", None, "The experiment's config file (configs/*.py).")
  flags.DEFINE_string("workdir", None, "The experiment's directory.")
  flags.DEFINE_bool("study", False, "Train the file's study (normstudy.study: its study arms at "
                    "its seeds) rather than its sweep; for an experiment of kind grid.")
  cli.define_workers_flag()
  flags.declare_key_flag("workers")
  flags.mark_flags_as_required(["config", "workdir"])


def stages(declared, path: str, workdir: str, workers: int | None, study: bool) -> list:
  """The argv (after `python -m`) of each stage that runs `declared`, the Experiment of the
  config file `path`, into `workdir`: its kind's command, then its `then` commands."""
  where = [f"--config={path}", f"--workdir={workdir}"]
  with_workers = [f"--workers={workers}"] if workers else []
  if declared.kind == "ladder":
    first = [["normstudy.ladder", *where,
              *([f"--sweep_arg=--workers={workers}"] if workers else [])]]
  elif declared.kind == "drift":
    first = [["normstudy.drift", *where, *with_workers]]
  elif study or not (declared.has_main or declared.parts):
    first = [["normstudy.study", *where, *with_workers]]
  else:
    first = [["normstudy.sweep", *where, *with_workers]]
  if declared.kind == "techniques":
    first.append(["normstudy.techniques", *where])
  return first + [[_fill(token, workdir) for token in shlex.split(command)]
                  for command in declared.then]


def _fill(token: str, workdir: str) -> str:
  """A `then` command's token with "{workdir}" filled in, its path normalised (a sibling,
  "{workdir}/../horizon", as `runs/horizon`: the path a command records is the one a user
  types)."""
  if "{workdir}" not in token:
    return token
  flag, sep, path = token.rpartition("=")
  return f"{flag}{sep}{os.path.normpath(path.replace('{workdir}', workdir))}"


def main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  cli.check_workers(FLAGS.workers)
  from normstudy.experiments import grid
  from normstudy.experiments import workers as workers_lib
  declared = grid.load_experiment(FLAGS.config)
  if FLAGS.study and declared.kind != "grid":
    raise errors.UserError(f"--study is for an experiment of kind grid; {FLAGS.config}'s is "
                           f"{declared.kind} (leave --study out)")
  if FLAGS.study and not declared.arms:
    raise errors.UserError(f"--study: {FLAGS.config}'s EXPERIMENT lists no arms")
  planned = stages(declared, FLAGS.config, FLAGS.workdir, FLAGS.workers, FLAGS.study)
  for i, stage in enumerate(planned, start=1):
    command = " ".join(["python", "-m", *map(shlex.quote, stage)])
    print(f"[run] {declared.kind}, stage {i}/{len(planned)}: {command}", flush=True)
    code, = workers_lib.run_commands([[sys.executable, "-m", *stage]])
    if code == 2:
      raise errors.UserError(f"stage {i} ({stage[0]}) refused its input (above)")
    if code != 0:
      print(f"[run] stage {i} ({stage[0]}) stopped with exit code {code}; the same "
            "command resumes it", file=sys.stderr, flush=True)
      sys.exit(code)
  print(f"[run] done: {len(planned)} stage(s) into {os.path.normpath(FLAGS.workdir)}")


if __name__ == "__main__":
  cli.run(main, define_flags)
