"""This checkout's train step against another commit's, timed alternately in one sitting.

  python benchmarks/ab.py [--base HEAD~1] [--sizes seed,S,M] [--rounds 3] [--steps 15]

The other commit is exported with `git archive` to a temporary directory. Each round times every
size once in each tree, in a fresh process each time and in alternating order (the machine's
speed drifts; alternation spreads the drift over both sides). A timing is the median step time
of --steps steps after compilation of normstudy's engine as `normstudy.main` runs it (one run,
K = 1): `seed` is the seed figure's recipe (float16 encoder, width 64, 4 layers), S and M the
sizes of benchmarks/throughput.py (float32 decoders). Printed per size: the median over rounds
of each tree's ms/step and the speed-up (base time / this time).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = ("seed", "S", "M")

# Runs in the tree under test, with only APIs both trees share.
_TIMER = r"""
import json, statistics, sys
tree, size, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [tree, tree + "/benchmarks"]
import jax, numpy as np
import throughput
from normstudy.engine import sharding
config = throughput.seed_config() if size == "seed" else throughput.size_config(size)
m, rng = config.model, np.random.default_rng(0)
shape = (1, config.train.batch_size, m.max_len)
batch = {"tokens": rng.integers(0, m.vocab_size, shape).astype(np.int32)}
if not m.causal:
  batch["mask"] = rng.random(batch["tokens"].shape) < config.data.mask_prob
mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
try:  # normstudy.engine.execution since the commit that made it; sharding's functions before
  from normstudy.engine import execution
  program = execution.ProgramSteps(config, mesh, num_runs=1)
  state, step = program.initial([config]), program.train
except ImportError:
  state, shardings = sharding.create_states([config], mesh)
  step = sharding.jit_train_step(config, mesh, shardings, num_runs=1)
batch = sharding.global_batch(mesh, batch)
print(json.dumps({"ms": 1e3 * statistics.median(throughput._time(step, state, batch, steps))}))
"""


def export(rev: str, into: str) -> str:
  """The tree of commit `rev` under `into`."""
  archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, capture_output=True)
  subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
  return into


def time_step(tree: str, size: str, steps: int) -> float:
  out = subprocess.run([sys.executable, "-c", _TIMER, tree, size, str(steps)], check=True,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tree})
  return json.loads(out.stdout.strip().splitlines()[-1])["ms"]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--base", default="HEAD~1", help="the commit to compare against")
  parser.add_argument("--sizes", default="seed,S,M", help="comma-separated, from: seed, S, M")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=15, help="timed steps per measurement")
  parser.add_argument("--json", default=None, help="also write the figures to this file")
  args = parser.parse_args(argv)
  sizes = args.sizes.split(",")
  if any(s not in SIZES for s in sizes):
    sys.exit(f"error: --sizes={args.sizes} names a size not in: {', '.join(SIZES)}")
  if args.rounds < 1 or args.steps < 1:
    sys.exit(f"error: --rounds={args.rounds} and --steps={args.steps} must be at least 1")
  rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", args.base],
                       capture_output=True, text=True)
  if rev.returncode:
    sys.exit(f"error: --base={args.base} is not a commit of {ROOT}")
  with tempfile.TemporaryDirectory() as tmp:
    trees = {"base": export(args.base, tmp), "this": ROOT}
    times = {(size, side): [] for size in sizes for side in trees}
    for round_ in range(args.rounds):
      for size in sizes:
        order = ("base", "this") if round_ % 2 == 0 else ("this", "base")
        for side in order:
          times[size, side].append(time_step(trees[side], size, args.steps))
        print(f"round {round_ + 1}/{args.rounds} {size}: base {times[size, 'base'][-1]:.1f} ms, "
              f"this {times[size, 'this'][-1]:.1f} ms", flush=True)
  print(f"\nbase = {args.base} ({rev.stdout.strip()}), this = the working tree; "
        f"median of {args.rounds} rounds, ms per step")
  print(f"{'size':<6}{'base':>10}{'this':>10}{'speed-up':>10}")
  results = []
  for size in sizes:
    base, this = (statistics.median(times[size, side]) for side in ("base", "this"))
    results.append({"size": size, "base_ms": base, "this_ms": this, "speedup": base / this,
                    "base_all": times[size, "base"], "this_all": times[size, "this"]})
    print(f"{size:<6}{base:>10.1f}{this:>10.1f}{base / this:>9.2f}x")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"base": args.base, "rows": results}, f, indent=2)


if __name__ == "__main__":
  main()
