"""The search runner: a field's critical value per grid point by bisection (normstudy.experiments.search),
each round's runs planned and trained as a grid's, each run judged by the failure rule the
analysis reports (normstudy.records.outcomes).

  run_search(spec, search, workdir, ...)      every round, sweep.json after each, the analysis
  search_share(spec, search, workdir, K, I, N)   the I-th of N shares of round K's programs (a
                                              cluster job array's task)

The same outcomes always give the same rounds, so a killed search resumes by replaying its
rounds from the runs' records (finished and halted runs are not trained again), and more rounds
continue it.
"""

from absl import logging

from normstudy.experiments import search as search_lib
from normstudy.errors import UserError
from normstudy.experiments import grid
from normstudy.experiments import planning
from normstudy.experiments import workers as workers_lib
from normstudy.records import outcomes
from normstudy.records import rundir
from normstudy.records import schema


def search_runs(spec: grid.Grid, field: str, workdir: str, todo: dict, points: dict) -> list:
  """[(point name, value, run)] of one round: each point's values, each a run named by the
  searched value first (`lr0.1778_seed0`); each arm's config built once for the round."""
  pairs = [(name, value) for name, values in todo.items() for value in values]
  runs = grid.points(spec.path, spec.variant, {}, spec.overrides, spec.experiment, sweep=True,
                     workdir=workdir, settings=spec.settings,
                     only=[(points[name].arm, {field: value, **points[name].point})
                           for name, value in pairs])
  return [(name, value, run) for (name, value), run in zip(pairs, runs)]


def round_outcomes(round_runs: list) -> dict:
  """{point: {value: failed}} of a trained round (`search_runs`), each run judged from its
  records by the failure rule (normstudy.records.outcomes)."""
  failed = {}
  for name, value, run in round_runs:
    ended = rundir.RunDir(run.directory).outcome()
    if ended.kind == outcomes.UNFINISHED:  # a preemption raises before this
      raise RuntimeError(f"{run.name} is unfinished: neither finished nor failed")
    failed.setdefault(name, {})[value] = ended.failed
  return failed


def _search_record(search_, points: dict, history: dict) -> schema.SearchRecord:
  return schema.SearchRecord.from_json({**search_.as_json(), "points": [
      {"name": name, "arm": p.arm, "point": p.point,
       "brackets": [b.as_json() for b in history[name]]} for name, p in points.items()]})


def run_search(spec: grid.Grid, search_, workdir: str, analyze, allow_config_change: bool = False,
               max_runs: int = grid.MAX_RUNS_PER_PROGRAM, workers: int = 0, describe=None):
  """Bisects `search_.field` per point of `spec` (normstudy.experiments.search): each round's runs are
  planned (grouped into programs, every run checked) and trained as a grid's; sweep.json
  records every run and each point's bracket after every round; then `analyze(workdir)` (the
  command's analysis). Round 1's runs are planned, and so checked, before anything is written;
  later rounds differ from them only in the searched value. Returns (statuses by run name,
  analysis outputs)."""
  rundir.check_writable(workdir, "--workdir")
  rundir.check_kind(workdir, "sweep")
  points = grid.search_points(spec)
  first_todo = {n: [search_.low, search_.high] for n in points}
  first_runs = search_runs(spec, search_.field, workdir, first_todo, points)
  planned = {1: (first_todo, first_runs, planning.plan_programs(
      spec, workdir, [run for _, _, run in first_runs], allow_config_change, max_runs,
      workers))}
  if describe is not None:
    probing = (f", then a probe round {search_.probe_decades:g} decades either side of each "
               "midpoint" if search_.probe_decades > 0 else "")
    most = len(points) * (search_.rounds + 1 + (2 if search_.probe_decades > 0 else 0))
    describe([f"search: {search_.field} in [{search_.low:g}, {search_.high:g}] for each of "
              f"{len(points)} point(s), {search_.rounds} round(s) (round 1 checks the bracket, "
              f"each later one halves it){probing}: at most {most} runs"])
  all_runs, statuses, recorded = [], {}, {"search": None}

  def train_round(k, todo):
    if k in planned and planned[k][0] == todo:
      _, round_runs, plan_ = planned.pop(k)
    else:
      round_runs = search_runs(spec, search_.field, workdir, todo, points)
      plan_ = planning.plan_programs(spec, workdir, [run for _, _, run in round_runs],
                                     allow_config_change, max_runs, workers)
    logging.info("search round %d/%d: %d run(s), %d to train", k, search_.total_rounds,
                 len(round_runs), sum(len(group) for _, group in plan_.todo))
    all_runs.extend(run for _, _, run in round_runs)
    with planning.recorded_on_stop(lambda: grid.write_sweep(  # this round's runs too, as they
        workdir, spec, all_runs, {**statuses, **planning.recorded_statuses(all_runs)},  # stopped
        search=recorded["search"])):
      statuses.update(planning.train_plan(plan_, pool))
    return round_outcomes(round_runs)

  def record(history):  # sweep.json after every round: a killed search shows how far it got
    recorded["search"] = _search_record(search_, points, history)
    return grid.write_sweep(workdir, spec, all_runs, statuses, search=recorded["search"])

  rundir.ensure_directory(workdir)
  # One pool of workers for every round: each round trains every arm's program again, and a
  # worker that trained it before steps it without tracing or loading it again.
  with planning.lock(workdir):
    with workers_lib.Pool() as pool:
      history = search_lib.run(search_, list(points), train_round, after_round=record)
    outputs = analyze(workdir)
    outputs["sweep"] = record(history)
  return statuses, outputs


def search_share(spec: grid.Grid, search_, workdir: str, round_: int, index: int, count: int,
                 allow_config_change: bool = False, max_runs: int = grid.MAX_RUNS_PER_PROGRAM,
                 workers: int = 0, describe=None) -> dict:
  """Trains the index-th of `count` shares (planning.share) of search round `round_`'s
  programs: one task of a cluster job array (launch/sweep.sh --grid). The rounds before it are
  replayed from their runs' records, so they must all be trained (UserError naming the round
  otherwise, before anything is written); which runs round `round_` trains follows from them as
  in `run_search`. No lock of the sweep and no sweep.json: other shares train beside this one,
  and the search run whole afterwards trains nothing left and writes the record and the
  analysis. `describe(lines)` is told the share's programs. Returns {run name: status} of the
  share's runs."""
  rundir.check_writable(workdir, "--workdir")
  rundir.check_kind(workdir, "sweep")
  points = grid.search_points(spec)
  trained = {}

  def train_round(k, todo):
    round_runs = search_runs(spec, search_.field, workdir, todo, points)
    plan_ = planning.plan_programs(spec, workdir, [run for _, _, run in round_runs],
                                   allow_config_change, max_runs, workers)
    if k < round_:
      if plan_.todo:
        left = sum(1 for _, group in plan_.todo for run in group if planning.needs_training(run))
        raise UserError(f"--round={round_}: round {k} of the search has {left} run(s) not "
                        f"trained yet; train its shares first (--round={k} --programs=I/N)")
      return round_outcomes(round_runs)
    mine = planning.share(plan_, index, count)
    if describe is not None:
      describe([f"share {index}/{count} of round {round_}: programs "
                f"{', '.join(str(i) for i, _ in mine.todo) or 'none left to train'}"])
    trained.update(planning.train_share(mine))
    return {}

  search_lib.run(search_, list(points), train_round, last_round=round_)
  return trained
