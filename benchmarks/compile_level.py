"""LLVM's optimisation level for a run's programs: what each level costs to compile, how fast
its steps run, and whether its records are the default level's, bit for bit.

  python benchmarks/compile_level.py [--levels default,2,1,0] [--learning_rate 0.2]
                                     [--steps 240] [--config configs/survival.py:pre_norm_clip1]

Each level trains the survival recipe's run (configs/survival.py's settings: a 20-step warm-up,
then a constant learning rate, the fp16 loss scale from 2^15, records every 5 steps, telemetry
every 50) once with `normstudy.main`, in a fresh process with an empty compilation cache and
XLA_FLAGS=--xla_backend_optimization_level=L ("default": no flag, XLA's level 3). Printed per
level: the wall time, the compile time of the block of steps (from the run's log), the steady
state steps/s (the median of the records' tokens/s after step 60) and whether its records,
timings aside, equal the first level's.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configs import survival  # noqa: E402
from dispatch import steps_per_second  # noqa: E402 (benchmarks/ is sys.path[0] when run)


def train(level: str, config: str, learning_rate: float, steps: int, tmp: str) -> tuple:
  """(wall seconds, [(program, compile seconds)], steady-state steps/s, records) of one run at
  `level`."""
  workdir = os.path.join(tmp, f"run_{level}")
  settings = {**survival.settings_at(steps), "train.telemetry_every": survival.LOGIT_STEP,
              "optimizer.learning_rate": learning_rate}
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(tmp, f"cache_{level}"))
  env.pop("XLA_FLAGS", None)
  if level != "default":
    env["XLA_FLAGS"] = f"--xla_backend_optimization_level={level}"
  started = time.perf_counter()
  done = subprocess.run([sys.executable, "-m", "normstudy.main", f"--config={config}",
                         f"--workdir={workdir}",
                         *(f"--config.{k}={v}" for k, v in settings.items())],
                        cwd=ROOT, env=env, capture_output=True, text=True)
  wall = time.perf_counter() - started
  records = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(records):  # a run that halts exits 1 and still writes its records
    sys.exit(f"error: level {level}: no records\n{done.stderr[-2000:]}")
  compiles = re.findall(r"\] (.*?): compiled in ([0-9.]+)s", done.stderr)
  with open(os.path.join(workdir, "run.json"), encoding="utf-8") as f:
    tokens_per_step = json.load(f)["tokens_per_step"]
  with open(records, encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  return wall, compiles, steps_per_second(records, tokens_per_step), records


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--levels", default="default,2,1,0")
  parser.add_argument("--learning_rate", type=float, default=0.2)
  parser.add_argument("--steps", type=int, default=240)
  parser.add_argument("--config", default="configs/survival.py:pre_norm_clip1")
  args = parser.parse_args(argv)
  levels = args.levels.split(",")
  bad = [x for x in levels if x not in ("default", "0", "1", "2", "3")]
  if bad:
    sys.exit(f"error: --levels: {', '.join(bad)}; allowed: default, 0, 1, 2, 3")
  kept = {}
  with tempfile.TemporaryDirectory() as tmp:
    for level in levels:
      wall, compiles, rate, records = train(level, args.config, args.learning_rate, args.steps,
                                            tmp)
      kept[level] = [{k: v for k, v in r.items() if k != "tokens_per_sec"} for r in records]
      same = "" if level == levels[0] else (
          f"; records {'equal to' if kept[level] == kept[levels[0]] else 'DIFFER from'} "
          f"level {levels[0]}'s")
      block = ", ".join(f"{name} {seconds} s" for name, seconds in compiles) or "none logged"
      print(f"level {level}: wall {wall:.1f} s; compiled: {block}; steady state "
            f"{rate:.1f} steps/s{same}", flush=True)


if __name__ == "__main__":
  main()
