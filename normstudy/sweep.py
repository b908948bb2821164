"""Train a grid of runs, then the analysis; runs that differ only in data share one program.

  python -m normstudy.sweep --config=configs/seed_figure.py:pre_norm_clip1 --workdir=DIR \\
      --axis=optimizer.learning_rate=1e-3,3e-3,1e-2 --axis=train.seed=0,1,2 [--config.x=y ...]

The grid is the product of the axes (normstudy.experiments.grid): with --config=FILE:ARM, of
that arm; with --config=FILE, of every arm of the file's EXPERIMENT (its sweep_arms; each in
DIR/<arm>/...). The experiment's axes ({dotted.field: [values]}) are the sweep's; --axis adds to
them or replaces an axis of the same field (the same --axis twice, or a --config.X of an axis's
field, is refused). A run's config is its arm's, then the experiment's settings, then
--config.X, then the point's values; the grid is planned once (expanded, grouped into programs,
every run checked) and printed before anything trains. Points that differ only in data fields
(learning rate, clip norm, weight decay, warm-up, Adam's betas and eps, seed, limits, loss-scale
settings) share one compiled program (normstudy.engine.execution: vmapped on an accelerator, one run
after another on a CPU); fields that change the program (placement, depth, dtype, ...) make one
program per structural point, trained one after another or side by side (--workers). Each run writes
DIR/<run>/ as a single run does; stacked checkpoints live under DIR/checkpoints/; DIR/sweep.json
lists the axes and each run's status. Re-running the same command resumes where it stopped.

A file's EXPERIMENT (normstudy.core.experiment) is run whole by `--config=FILE --workdir=DIR`:
its axes and settings, its search (with its rounds and probes),
then each of its parts into DIR/<part>, then the analysis of DIR (and the interaction with the
sibling search it names); sweep.json records it. Flags still override what it declares.

--search=FIELD:LOW,HIGH --rounds=N bisects FIELD for every point of the other axes instead of
sweeping it (normstudy.experiments.search; docs/reference.md, "The critical learning rate by search").

On a cluster (launch/sweep.sh --grid): --programs=I/N trains the I-th of N shares of the grid's
programs; a search shares one round at a time (--round=K --programs=I/N, every earlier round
trained first). The same command without --programs then trains nothing left and writes
sweep.json and the analysis.
"""

import dataclasses
import os

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags
from ml_collections import config_flags

from normstudy import errors
from normstudy.experiments import search

# normstudy.experiments.grid.MAX_RUNS_PER_PROGRAM (tests/test_sweep.py checks they agree): grid
# imports the model stack, which --help must not wait for.
MAX_RUNS_PER_PROGRAM = 0

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file("config", None, "Config file[:variant].", lock_config=True)
  flags.DEFINE_string("workdir", None, "Sweep directory; one subdirectory per run.")
  flags.DEFINE_multi_string("axis", [], "dotted.field=value1,value2,... (repeatable).")
  flags.DEFINE_bool("allow_config_change", False,
                    "Continue runs whose saved config differs in model, optimizer or data.")
  flags.DEFINE_integer("max_runs_per_program", MAX_RUNS_PER_PROGRAM,
                       "Split a program of more runs into equal parts (0 = no limit); keep it "
                       "the same when resuming.")
  flags.DEFINE_string("search", None,
                      "FIELD:LOW,HIGH: bisect FIELD per point of the other axes instead of "
                      "sweeping it (normstudy.experiments.search), e.g. optimizer.learning_rate:0.1,1.")
  flags.DEFINE_string("programs", None,
                      "I/N: train only the I-th of N shares of the grid's programs (a cluster "
                      "job array's task: program i goes to share (i - 1) % N + 1), into the same "
                      "directories; then the sweep without --programs writes sweep.json and the "
                      "analysis (launch/sweep.sh --grid). With --search: of --round's programs.")
  flags.DEFINE_integer("rounds", search.DEFAULT_ROUNDS,
                       "Rounds of --search: the first checks the bracket, each later one halves "
                       "it; more rounds continue a finished search.")
  flags.DEFINE_float("probe_decades", 0.0,
                     "With --search: after the rounds, a probe round trains every point at its "
                     "midpoint this many decades lower and higher, where the probes inform the "
                     "transition's width (normstudy.experiments.search; 0: none).")
  flags.DEFINE_integer("round", None,
                       "With --search and --programs=I/N: the search round whose programs to "
                       "share (1..--rounds); every earlier round must be trained (a job array "
                       "per round, each after the one before: launch/sweep.sh --grid).")
  cli.define_workers_flag()
  cli.define_print_config_flag()
  flags.declare_key_flag("print_config")  # defined in normstudy.cli; listed in --help
  flags.declare_key_flag("workers")  # defined in normstudy.cli; listed in this command's --help
  flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  from normstudy.experiments import grid
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  spec = config_flags.get_config_filename(FLAGS["config"])
  path, _, variant = spec.partition(":")
  declared = grid.load_experiment(path)
  axes = grid.axes_of(declared, FLAGS.axis)
  search_ = _parse_search(axes, declared.search)
  share = _parse_share(FLAGS.programs) if FLAGS.programs is not None else None
  _check_round(search_, share)
  if FLAGS.max_runs_per_program < 0:
    raise errors.UserError(f"--max_runs_per_program={FLAGS.max_runs_per_program} is not allowed;"
                           " allowed: 0 (no limit) or an integer >= 1")
  if not FLAGS["max_runs_per_program"].present:
    FLAGS.max_runs_per_program = declared.max_runs_per_program
  cli.check_workers(FLAGS.workers)
  parts_only = not declared.has_main and bool(declared.parts)
  if not axes and search_ is None and not parts_only:
    raise errors.UserError(f"no axes: pass --axis=dotted.field=v1,v2,... or declare axes in "
                           f"{path}'s EXPERIMENT")
  overrides = config_flags.get_override_values(FLAGS["config"])
  for field in overrides:
    if field in axes:
      origin = ("the file's EXPERIMENT" if field in grid.file_axes(declared, FLAGS.axis)
                else "an --axis flag")
      raise errors.UserError(
          f"--config.{field}={overrides[field]!r} would be overwritten by the sweep's axis "
          f"{field} ({origin}: {axes[field]}); drop --config.{field}, or sweep the values you "
          f"want with --axis={field}=v1,v2,...")
  if search_ is not None and search_.field in overrides:
    raise errors.UserError(f"--config.{search_.field}={overrides[search_.field]!r} would be "
                           f"overwritten by --search={FLAGS.search}; drop one")
  spec = grid.Grid(path, variant or None, axes, overrides, declared,
                   file_axes=tuple(grid.file_axes(declared, FLAGS.axis)))
  # Built (each config checked) before the training stack loads: a get_config that builds no
  # config is refused in a fraction of a second. A search's points stand at the file's value of
  # the searched field.
  if parts_only:  # each part's grid, checked now (named <part>/<run>, as they will be)
    grid_runs = [dataclasses.replace(run, name=f"{name}/{run.name}")
                 for name, part in declared.parts.items()
                 for run in _part_runs(grid.for_part(spec, name, part), part)]
  else:
    grid_runs = (list(grid.search_points(spec).values()) if search_ is not None
                 else spec.runs(FLAGS.workdir))
  from normstudy.records import storage
  storage.check_workdir(FLAGS.workdir)
  if FLAGS.print_config:
    print(cli.runs_config_text(grid_runs))
    return
  # Printed once the plan is checked: what every arm's config changes from the defaults.
  changes = cli.grid_config_changes(grid_runs, {*axes, *([search_.field] if search_ else [])})
  with storage.staged(FLAGS.workdir) as workdir:  # gs://: through a local stage
    statuses, outputs = ({}, {}) if parts_only else _train(spec, search_, share, changes,
                                                            workdir)
    if statuses is None:  # a share of a cluster's job array: the rest is the others'
      return
    if declared.parts or declared.against:
      outputs.update(_parts_and_analysis(spec, declared, workdir, statuses))
    outputs = {name: storage.remote(out) for name, out in outputs.items()}
  for name, out in outputs.items():
    print(f"{name}: {out}")
  print(f"runs: {_counts(statuses)}")


def _train(spec, search_, share, changes: list, workdir: str) -> tuple:
  """Trains the grid or the search of `spec` into `workdir` (or, with `share`, its share of a
  cluster's programs: then (None, None)); returns (statuses, the analysis's outputs)."""
  from normstudy import analysis
  from normstudy.experiments import planning  # the training stack, once the command line is good
  from normstudy.experiments import search_runner
  describe = lambda lines: _print_lines([*lines, *changes])  # noqa: E731
  if search_ is not None and share is not None:
    statuses = search_runner.search_share(
        spec, search_, workdir, FLAGS.round, *share, FLAGS.allow_config_change,
        FLAGS.max_runs_per_program, FLAGS.workers, describe=describe)
    _print_share_end(share, statuses, f" of round {FLAGS.round}")
    return None, None
  if search_ is not None:
    return search_runner.run_search(spec, search_, workdir, analysis.analyze,
                                    FLAGS.allow_config_change, FLAGS.max_runs_per_program,
                                    FLAGS.workers, describe=describe)
  plan = planning.plan(spec, workdir, FLAGS.allow_config_change, FLAGS.max_runs_per_program,
                       FLAGS.workers)
  describe(plan.describe())
  if share is not None:
    plan = planning.share(plan, *share)
    _print_lines([f"share {share[0]}/{share[1]}: programs "
                  f"{', '.join(str(i) for i, _ in plan.todo) or 'none left to train'}"])
    _print_share_end(share, planning.train_share(plan))
    return None, None
  return planning.run_grid(plan, analysis.analyze)


def _part_runs(spec, part) -> list:
  """The runs (or a search's points) of a part's grid `spec`, checked."""
  from normstudy.experiments import grid
  if part.search is not None:
    return list(grid.search_points(spec).values())
  return spec.runs(FLAGS.workdir)


def _parse_search(axes: dict, declared=None):
  """The Search of --search and --rounds (or of the file's EXPERIMENT, `declared`: a
  normstudy.core.experiment.Search, its rounds and probes unless the flags say), or None;
  the searched field leaves `axes` (the file's grid of it: the search replaces it). UserError
  for what is wrong."""
  if FLAGS.search is None and declared is None:
    for name in ("rounds", "round", "probe_decades"):
      if FLAGS[name].present:
        raise errors.UserError(f"--{name}={FLAGS[name].value} needs --search=FIELD:LOW,HIGH")
    return None
  from normstudy.experiments import grid
  text = FLAGS.search if FLAGS.search is not None else declared.flag
  rounds = FLAGS.rounds if FLAGS["rounds"].present or declared is None else declared.rounds
  probes = (FLAGS.probe_decades if FLAGS["probe_decades"].present or declared is None
            else declared.probe_decades)
  search_ = search.Search.parse(text, rounds, probes)
  if any(grid.parse_axis(t)[0] == search_.field for t in FLAGS.axis):
    raise errors.UserError(f"--axis={search_.field}=... and --search={text} both set "
                           f"{search_.field}; drop one")
  axes.pop(search_.field, None)
  return search_


def _check_round(search_, share) -> None:
  """A search's rounds depend on the rounds before, so its programs are shared one round at a
  time: --programs with --search needs --round, and --round needs --programs."""
  if search_ is None:
    return
  if share is not None and FLAGS.round is None:
    raise errors.UserError(f"--programs={FLAGS.programs} with --search needs --round=K (the "
                           f"round to share, 1..{search_.total_rounds}): a round's runs depend on "
                           "the outcomes of the rounds before")
  if FLAGS.round is not None and share is None:
    raise errors.UserError(f"--round={FLAGS.round} needs --programs=I/N (without it the search "
                           "trains every round itself)")
  if FLAGS.round is not None and not 1 <= FLAGS.round <= search_.total_rounds:
    probe = " and a probe round" if search_.probe_decades > 0 else ""
    raise errors.UserError(f"--round={FLAGS.round} is not allowed; allowed: "
                           f"1..{search_.total_rounds} (--rounds={search_.rounds}{probe})")


def _parts_and_analysis(spec, declared, workdir: str, statuses: dict) -> dict:
  """After the main sweep of a declared experiment: each part's sweep into workdir/<part> (its
  runs' statuses added to `statuses`), then the analysis of workdir with the parts' runs, and
  the interaction with the sibling search `against` names when it holds one."""
  from normstudy import analysis
  from normstudy.experiments import grid
  from normstudy.experiments import planning
  from normstudy.experiments import search as search_lib
  from normstudy.experiments import search_runner
  for name, part in declared.parts.items():
    part_spec = grid.for_part(spec, name, part)
    where = os.path.join(workdir, name)
    _print_lines([f"part {name} of the experiment, into {where}:"])
    if part.search is not None:
      found = search_lib.Search.parse(part.search.flag, part.search.rounds,
                                      part.search.probe_decades)
      part_statuses, _ = search_runner.run_search(
          part_spec, found, where, analysis.analyze, FLAGS.allow_config_change,
          part.max_runs_per_program, FLAGS.workers, describe=_print_lines)
    else:
      plan = planning.plan(part_spec, where, FLAGS.allow_config_change,
                           part.max_runs_per_program, FLAGS.workers)
      _print_lines(plan.describe())
      part_statuses, _ = planning.run_grid(plan, analysis.analyze)
    statuses.update({f"{name}/{run}": status for run, status in part_statuses.items()})
  if not declared.has_main:
    return {}
  outputs = analysis.analyze(workdir)  # with the parts' runs (a search's learning runs)
  against = os.path.join(os.path.dirname(os.path.normpath(workdir)), declared.against)
  if declared.against and os.path.isfile(os.path.join(against, "sweep.json")):
    outputs.update(analysis.interaction.analyze(against, workdir))
  elif declared.against:
    print(f"no search in {against} (the experiment compares with it): its interaction is "
          "written once that search has run, by this command again")
  return outputs


def _print_share_end(share, statuses: dict, which: str = "") -> None:
  print(f"share {share[0]}/{share[1]}{which}: " + (f"runs {_counts(statuses)}" if statuses
                                                   else "nothing to train"))


def _counts(statuses: dict) -> str:
  """'2 finished, 1 halted': how many runs ended in each status."""
  values = list(statuses.values())
  return ", ".join(f"{values.count(s)} {s}" for s in sorted(set(values)))


def _parse_share(text: str) -> tuple[int, int]:
  """(I, N) of --programs=I/N; UserError unless 1 <= I <= N."""
  index, slash, count = text.partition("/")
  if slash and index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count):
    return int(index), int(count)
  raise errors.UserError(f"--programs={text} is not allowed; allowed: I/N with "
                         "1 <= I <= N, e.g. --programs=2/8 (the second of 8 shares)")


def _print_lines(lines) -> None:
  for line in lines:
    print(line, flush=True)


if __name__ == "__main__":
  cli.run(main, define_flags)
