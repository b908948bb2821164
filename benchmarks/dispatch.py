"""Steps per dispatch: the train loop stepping one step per host round trip against blocks of
steps in one compiled loop (train.steps_per_dispatch), as `normstudy.main` runs it.

  python benchmarks/dispatch.py [--per_dispatch 1,16] [--steps 300] [--rounds 3]
                                [--config configs/survival.py:pre_norm_clip1]

Each round trains the same run once per setting, each in a fresh process, alternating (the
machine's speed drifts; alternation spreads the drift over both sides), with the persistent
compilation cache of the first round. A timing is the run's steady state: the median of its
records' tokens/s after step 60 (the first records hold the compilation), as steps per second.
The run is the survival recipe's (configs/survival.py: float16 seed recipe, constant learning
rate 0.01 after a 20-step warm-up, records every 5 steps, telemetry every 50, an evaluation and
checkpoint at the end). Printed: each setting's median over rounds and the speed-up against the
first setting; then whether the two settings' records are equal (they are bit for bit).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(config: str, steps: int, per_dispatch: int, workdir: str, cache: str) -> list:
  settings = {"train.num_steps": steps, "optimizer.warmup_steps": 20,
              "optimizer.schedule": "constant", "optimizer.learning_rate": 0.01,
              "train.log_every": 5, "train.eval_every": steps, "train.telemetry_every": 50,
              "train.checkpoint_every": steps, "train.tensorboard": False,
              "train.steps_per_dispatch": per_dispatch}
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache)
  subprocess.run([sys.executable, "-m", "normstudy.main", f"--config={config}",
                  f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in settings.items())],
                 cwd=ROOT, env=env, check=True, capture_output=True, text=True)
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def steps_per_second(records: list, tokens_per_step: int) -> float:
  rates = [r["tokens_per_sec"] for r in records if r["step"] > 60 and "tokens_per_sec" in r]
  return statistics.median(rates) / tokens_per_step


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--per_dispatch", default="1,16")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--config", default="configs/survival.py:pre_norm_clip1")
  args = parser.parse_args(argv)
  settings = [int(s) for s in args.per_dispatch.split(",")]
  timings = {s: [] for s in settings}
  trajectories = {}
  with tempfile.TemporaryDirectory() as tmp:
    cache = os.path.join(tmp, "cache")
    for round_index in range(args.rounds):
      order = settings if round_index % 2 == 0 else settings[::-1]
      for s in order:
        workdir = os.path.join(tmp, f"run_{s}_{round_index}")
        records = train(args.config, args.steps, s, workdir, cache)
        with open(os.path.join(workdir, "run.json"), encoding="utf-8") as f:
          tokens_per_step = json.load(f)["tokens_per_step"]
        timings[s].append(steps_per_second(records, tokens_per_step))
        trajectories[s] = [{k: v for k, v in r.items() if k != "tokens_per_sec"}
                           for r in records]
        print(f"round {round_index + 1}/{args.rounds} steps_per_dispatch={s}: "
              f"{timings[s][-1]:.2f} steps/s", flush=True)
  base = statistics.median(timings[settings[0]])
  print(f"\n{args.config}, {args.steps} steps; median of {args.rounds} rounds, steps per second")
  print(f"{'steps_per_dispatch':>18} {'steps/s':>8} {'speed-up':>9}")
  for s in settings:
    median = statistics.median(timings[s])
    print(f"{s:>18} {median:8.2f} {median / base:8.2f}x")
  same = all(trajectories[s] == trajectories[settings[0]] for s in settings)
  print(f"records equal across settings: {same}")


if __name__ == "__main__":
  main()
