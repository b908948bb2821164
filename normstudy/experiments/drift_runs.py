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
# What configs/drift.py must declare: name -> what it is (checked by `experiment`).
DECLARED = {
    "ARMS": "the law's arms (names of VARIANTS)",
    "DECAY_BASE": "the arm the weight decays vary (a name of VARIANTS)",
    "WEIGHT_DECAYS": "{arm: weight decay} of the base arm at other weight decays",
    "NUM_STEPS": "the fit's steps a run",
    "HELDOUT_STEPS": "the held-out horizon",
    "HELDOUT_ARMS": "the held-out arms (names of ARMS)",
    "HELDOUT_SEEDS": "the held-out seeds",
    "HELDOUT_FRACTIONS": "the failure fractions the held-out rates are placed at",
}


def experiment(path: str, module) -> dict:
  """The experiment `path` (its loaded `module`) declares, checked: UserError naming the file
  and what is wrong."""
  missing = [name for name in DECLARED if not hasattr(module, name)]
  if missing:
    raise UserError(f"--config={path} is not a drift experiment: it does not define "
                    f"{', '.join(missing)} (configs/drift.py shows them)")
  variants = dict(getattr(module, "VARIANTS", {}))
  arms = list(module.ARMS)
  unknown = [a for a in [*arms, module.DECAY_BASE, *module.WEIGHT_DECAYS] if a not in variants]
  if unknown:
    raise UserError(f"{path}: {', '.join(unknown)} not among its VARIANTS "
                    f"({', '.join(variants)})")
  held = [a for a in module.HELDOUT_ARMS if a not in arms]
  if held:
    raise UserError(f"{path}: HELDOUT_ARMS {', '.join(held)} not among ARMS ({', '.join(arms)})")
  for name in ("NUM_STEPS", "HELDOUT_STEPS"):
    value = getattr(module, name)
    if not isinstance(value, int) or value < 1:
      raise UserError(f"{path}: {name}={value!r} is not allowed; allowed: an integer >= 1")
  if module.HELDOUT_STEPS < 2 * module.NUM_STEPS:
    raise UserError(f"{path}: HELDOUT_STEPS={module.HELDOUT_STEPS} is not allowed; allowed: at "
                    f"least 2 x NUM_STEPS = {2 * module.NUM_STEPS} (a held-out horizon twice "
                    "the longest fitted)")
  fractions = list(module.HELDOUT_FRACTIONS)
  if not fractions or not all(isinstance(f, float) and 0 < f < 1 for f in fractions):
    raise UserError(f"{path}: HELDOUT_FRACTIONS={module.HELDOUT_FRACTIONS!r} is not allowed; "
                    "allowed: fractions strictly between 0 and 1")
  seeds = list(module.HELDOUT_SEEDS)
  if len(seeds) < 1 or not all(isinstance(s, int) and s >= 0 for s in seeds):
    raise UserError(f"{path}: HELDOUT_SEEDS={module.HELDOUT_SEEDS!r} is not allowed; allowed: "
                    "integers >= 0")
  base_decay = float(module.get_config(module.DECAY_BASE).optimizer.weight_decay)
  decays = {module.DECAY_BASE: base_decay,
            **{arm: float(wd) for arm, wd in module.WEIGHT_DECAYS.items()}}
  return {"config": path, "arms": arms, "decay_arms": decays, "num_steps": module.NUM_STEPS,
          "heldout": {"arms": list(module.HELDOUT_ARMS), "steps": module.HELDOUT_STEPS,
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
