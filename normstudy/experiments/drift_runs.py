"""The drift experiment's runs (configs/drift.py, `make drift`): what the file declares, checked;
the fit trained as one `normstudy.sweep`; the held-out horizon trained, once its prediction is
written, as one sweep per held-out arm at the rates the prediction chose.

The workdir's `drift.json` records the declared experiment whole (its arms, weight decays,
held-out arms, horizon, seeds and fractions, and every command it ran), so the analysis
(normstudy.analysis.horizon_report) reads what to compare from it and any part can be re-run
from it alone.
"""

import os
import shlex
import sys
import time

from normstudy.errors import UserError
from normstudy.experiments import workers as workers_lib
from normstudy.records import rundir
from normstudy.records import schema

PLAN = schema.DRIFT_PLAN
FIT = schema.DRIFT_FIT
HELDOUT = schema.DRIFT_HELDOUT
def experiment(path: str, declared) -> dict:
  """The drift experiment `path` declares (its Experiment, `declared`), checked: UserError naming
  the file and what is wrong."""
  drift = declared.drift
  if drift is None:
    raise UserError(f"--config={path} is not a drift experiment: its EXPERIMENT declares no "
                    "drift=Drift(...) (configs/drift.py shows one)")
  arms = list(drift.law_arms)
  unknown = [a for a in [*arms, drift.decay_base, *drift.weight_decays]
             if a not in declared.arms]
  if unknown:
    raise UserError(f"{path}: {', '.join(unknown)} not among its EXPERIMENT's arms "
                    f"({', '.join(declared.arms)})")
  held = [a for a in drift.heldout.arms if a not in arms]
  if held:
    raise UserError(f"{path}: the held-out arms {', '.join(held)} are not among the law's arms "
                    f"({', '.join(arms)})")
  for name, value in (("num_steps", drift.num_steps), ("heldout.steps", drift.heldout.steps)):
    if not isinstance(value, int) or value < 1:
      raise UserError(f"{path}: Drift's {name}={value!r} is not allowed; allowed: an integer "
                      ">= 1")
  if drift.heldout.steps < 2 * drift.num_steps:
    raise UserError(f"{path}: Drift's heldout.steps={drift.heldout.steps} is not allowed; "
                    f"allowed: at least 2 x num_steps = {2 * drift.num_steps} (a held-out "
                    "horizon twice the longest fitted)")
  fractions = list(drift.heldout.fractions)
  if not fractions or not all(isinstance(f, float) and 0 < f < 1 for f in fractions):
    raise UserError(f"{path}: Drift's heldout.fractions={drift.heldout.fractions!r} is not "
                    "allowed; allowed: fractions strictly between 0 and 1")
  seeds = list(drift.heldout.seeds)
  if len(seeds) < 1 or not all(isinstance(s, int) and s >= 0 for s in seeds):
    raise UserError(f"{path}: Drift's heldout.seeds={drift.heldout.seeds!r} is not allowed; "
                    "allowed: integers >= 0")
  base_decay = float(declared.get_config(drift.decay_base).optimizer.weight_decay)
  decays = {drift.decay_base: base_decay,
            **{arm: float(wd) for arm, wd in drift.weight_decays.items()}}
  return {"config": path, "arms": arms, "decay_arms": decays, "num_steps": drift.num_steps,
          "heldout": {"arms": list(drift.heldout.arms), "steps": drift.heldout.steps,
                      "seeds": seeds, "fractions": fractions}, "commands": []}


def write_plan(workdir: str, plan: dict) -> dict:
  """drift.json: written on the first call; a workdir holding another experiment is refused
  (UserError), the same one resumed (its commands kept)."""
  path = os.path.join(workdir, PLAN)
  held = rundir.read_json(path)
  if held:
    if {k: v for k, v in held.items() if k != "commands"} != {
        k: v for k, v in plan.items() if k != "commands"}:
      raise UserError(f"--workdir={workdir} holds another drift experiment ({path} differs from "
                      f"what {plan['config']} declares); use a new --workdir")
    return held
  os.makedirs(workdir, exist_ok=True)
  rundir.write_json(path, plan)
  return plan


def _record(workdir: str, command: str) -> None:
  path = os.path.join(workdir, PLAN)
  plan = rundir.read_json(path)
  if command not in plan["commands"]:
    plan["commands"].append(command)
    rundir.write_json(path, plan)


def fit_argv(plan: dict, workdir: str, workers: int) -> list:
  return [f"--config={plan['config']}", f"--workdir={os.path.join(workdir, FIT)}",
          f"--workers={workers}"]


def heldout_argv(plan: dict, workdir: str, arm: str, rates, workers: int) -> list:
  """normstudy.sweep's arguments for one held-out arm: its rates and seeds at the held-out
  horizon (evaluated and checkpointed at its end only)."""
  steps = plan["heldout"]["steps"]
  return [f"--config={plan['config']}:{arm}",
          f"--workdir={os.path.join(workdir, HELDOUT, arm)}",
          "--axis=optimizer.learning_rate=" + ",".join(f"{r:g}" for r in rates),
          "--axis=train.seed=" + ",".join(str(s) for s in plan["heldout"]["seeds"]),
          f"--config.train.num_steps={steps}", f"--config.train.eval_every={steps}",
          f"--config.train.checkpoint_every={steps}", f"--workers={workers}"]


def command_line(argv) -> str:
  return " ".join(["python", "-m", "normstudy.sweep", *map(shlex.quote, argv)])


def _check(code: int, what: str) -> None:
  if code == 2:
    raise UserError(f"{what}: normstudy.sweep refused its input (above)")
  if code != 0:
    raise RuntimeError(f"{what} stopped with exit code {code}; re-running resumes it")


def _sweep(argvs: list) -> list:
  """The exit codes of normstudy.sweep with each of `argvs`, side by side, each in its own
  process (a SIGTERM here reaches them: workers.run_commands)."""
  return workers_lib.run_commands([[sys.executable, "-m", "normstudy.sweep", *argv]
                                   for argv in argvs])


def train_fit(plan: dict, workdir: str, workers: int, extra=(), log=print) -> None:
  """The fit's sweep, in its own process (a finished sweep trains nothing again); `extra`:
  arguments for it (normstudy.drift's --sweep_arg)."""
  argv = [*fit_argv(plan, workdir, workers), *extra]
  _record(workdir, command_line(argv))
  log(f"[drift] the fit: {command_line(argv)}")
  _check(_sweep([argv])[0], "the fit")


def train_heldout(plan: dict, workdir: str, rates: dict, workers: int, extra=(), log=print
                  ) -> None:
  """Each held-out arm's sweep at `rates[arm]` (with `extra` arguments); with workers != 1, the
  arms' sweeps side by side (each with one worker), so two arms use two cores."""
  arms = plan["heldout"]["arms"]
  side_by_side = workers != 1 and len(arms) > 1
  argvs = {arm: [*heldout_argv(plan, workdir, arm, rates[arm], 1 if side_by_side else workers),
                 *extra] for arm in arms}
  for arm, argv in argvs.items():
    _record(workdir, command_line(argv))
  start = time.monotonic()
  if side_by_side:
    for arm in arms:
      log(f"[drift] held-out {arm} (side by side): {command_line(argvs[arm])}")
    codes = _sweep([argvs[arm] for arm in arms])
    for arm, code in zip(arms, codes):
      _check(code, f"held-out arm {arm}")
  else:
    for arm in arms:
      log(f"[drift] held-out {arm}: {command_line(argvs[arm])}")
      _check(_sweep([argvs[arm]])[0], f"held-out arm {arm}")
  log(f"[drift] held-out runs done in {time.monotonic() - start:.0f}s")


def rates_of(prediction) -> dict:
  """{arm: [rates]} of a prediction table (horizon_prediction.csv)."""
  return {arm: [float(r) for r in rows.lr] for arm, rows in prediction.groupby("arm", sort=False)}
