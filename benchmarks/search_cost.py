"""What a survival search's design costs in run-steps, and what it buys: the designs that could
bring `make survival` under issue 41's 45 minutes, each run in simulated worlds.

  python benchmarks/search_cost.py [--searches 300] [--designs current,one_sided,...]
                                   [--runs docs/survival] [--rate 33]

A simulated world is tests/test_transition.py's: every seed's runs fail with probability
sigmoid(slope (log10 lr - center)), the transition `width` decades from 10% to 90%. Each design
searches it as normstudy.experiments.search does (the same `search.run`), and the arm's transition is
fitted to every probe (normstudy.analysis.transition.fit), as `make survival`'s analysis does.

A probe's cost is what it cost in the committed search (--runs: its runs.csv and
critical_lr.csv): a survivor takes all 480 steps; a failure takes the mean number of steps the
committed search's failures took at its distance from its arm's critical learning rate, in
1/8-decade bins (read from the files, not assumed). Printed per design and world: the share of
searches whose 95% intervals cover the true center and the true width (the issue asks >= 90%),
the median width of the center's interval (decades), and the mean run-steps of one arm (6 seeds,
or the design's); then per design its mean run-steps over the worlds for the 7 arms of
`make survival`, and the minutes its steps alone take at --rate run-steps per second (the
2-core machine's ceiling, about 33-34: docs/throughput.md), before compilation, the learning
runs and the analysis.
"""

import argparse
import collections
import csv
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from normstudy.analysis import transition  # noqa: E402
from normstudy.experiments import search  # noqa: E402

# name -> (seeds, bisection rounds incl. round 1's check, probe decades, probe sides)
DESIGNS = {
    "current": (6, 4, 0.125, 2),       # the Makefile's SURVIVAL_SEARCH
    "one_sided": (6, 4, 0.125, 1),     # the probe round: one side per seed, alternating
    "no_probe": (6, 5, 0.0, 0),        # one more bisection round instead of the probe round
    "five_seeds": (5, 4, 0.125, 2),
    "four_seeds": (4, 4, 0.125, 2),
}
# (critical learning rate, width in decades): the test's worlds, and two at Pre-LN's 0.1.
WORLDS = [(0.25, 0.15), (0.25, 0.4), (0.4, 0.05), (0.2, 0.25), (0.1, 0.15), (0.11, 0.3)]
ARMS = 7
NUM_STEPS = 480


def failure_steps(directory: str) -> tuple:
  """(bin centres in decades above the arm's critical learning rate, mean steps a failed run
  took there) from a committed search's runs.csv and critical_lr.csv."""
  with open(os.path.join(directory, "critical_lr.csv"), encoding="utf-8") as f:
    critical = {r["arm"]: float(r["critical_lr"]) for r in csv.DictReader(f)}
  bins = collections.defaultdict(list)
  with open(os.path.join(directory, "runs.csv"), encoding="utf-8") as f:
    for r in csv.DictReader(f):
      if not r["failed_at"] or r["arm"] not in critical:
        continue
      distance = math.log10(float(r["learning_rate"]) / critical[r["arm"]])
      bins[round(distance * 8) / 8].append(int(r["steps"]))
  centres = sorted(bins)
  return np.array(centres), np.array([np.mean(bins[c]) for c in centres])


def simulate(center, width, rng, design, cost):
  """(log10 lrs, failed, run-steps) of one search of one arm in the world (center, width)."""
  seeds, rounds, decades, sides = design
  slope = transition.WIDTH_PER_SLOPE / width
  probes, spent = [], [0.0]

  def draw(value):
    distance = math.log10(value) - center
    failed = bool(rng.random() < 1 / (1 + math.exp(-slope * distance)))
    probes.append((math.log10(value), failed))
    spent[0] += cost(distance) if failed else NUM_STEPS
    return failed

  def train_round(k, todo):
    del k
    return {p: {v: draw(v) for v in values} for p, values in todo.items()}

  spec = search.Search.parse("optimizer.learning_rate:0.1,1", rounds,
                             decades if sides == 2 else 0.0)
  history = search.run(spec, list(range(seeds)), train_round)
  if sides == 1:
    for p in range(seeds):
      values = search.probe_values(history[p][-1], decades)
      if values:
        draw(values[p % 2])
  x, y = np.array(probes, dtype=float).T
  return x, y, spent[0]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--searches", type=int, default=300)
  parser.add_argument("--designs", default=",".join(DESIGNS))
  parser.add_argument("--runs", default=os.path.join(ROOT, "docs", "survival"))
  parser.add_argument("--rate", type=float, default=33.0)
  args = parser.parse_args()
  unknown = [d for d in args.designs.split(",") if d not in DESIGNS]
  if unknown:
    sys.exit(f"error: --designs: {', '.join(unknown)} unknown; allowed: {', '.join(DESIGNS)}")
  centres, steps = failure_steps(args.runs)
  cost = lambda distance: float(np.interp(distance, centres, steps))  # noqa: E731
  print("failure steps by decades above the critical lr: " + ", ".join(
      f"{c:+.3f}: {s:.0f}" for c, s in zip(centres, steps)))
  print(f"{'design':<12} {'world':<13} {'center':>7} {'width':>7} {'interval':>9} "
        f"{'run-steps':>10}")
  for name in args.designs.split(","):
    design, totals, worst = DESIGNS[name], [], 1.0
    for critical, width in WORLDS:
      rng = np.random.default_rng(int(critical * 1000 + width * 100))
      center = math.log10(critical)
      searched = [simulate(center, width, rng, design, cost) for _ in range(args.searches)]
      fits = [f for f in (transition.fit(x, y) for x, y, _ in searched) if f is not None]
      costs = [spent for _, _, spent in searched]
      # [center interval, width interval] of each fit: the share that holds the truth
      held = np.mean([[f.center_low <= center <= f.center_high,
                       f.width_low <= width <= f.width_high] for f in fits], axis=0)
      worst = min(worst, *held)
      totals.append(np.mean(costs))
      world = f"{critical:g}/{width:g}"
      print(f"{name:<12} {world:<13} {held[0]:7.3f} {held[1]:7.3f} "
            f"{np.median([f.center_high - f.center_low for f in fits]):9.3f} "
            f"{np.mean(costs):10.0f}", flush=True)
    run_steps = ARMS * float(np.mean(totals))
    print(f"{name}: {design[0]} seeds, {ARMS} arms: {run_steps:,.0f} run-steps, "
          f"{run_steps / args.rate / 60:.1f} min of steps at {args.rate:g}/s; "
          f"lowest coverage {worst:.3f}")


if __name__ == "__main__":
  main()
