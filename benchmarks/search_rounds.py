"""A whole search (its rounds, workers, programs) in this checkout against another commit's, timed
alternately in one sitting: what a search pays beside its steps (tracing, loading compiled
programs, starting workers) and what this tree saves of it.

  python benchmarks/search_rounds.py [--base HEAD~1] [--rounds 2] [--workers 0]
                                     [--rung 4,32] [--dtype float16]

The search is one rung of `make ladder` (configs/ladder.py: the ladder's 4 arms x 2 seeds on
Shakespeare, 120-step runs, LADDER_SEARCH's 3 rounds and probe round), at --rung
(num_layers,d_model). The other commit is exported with `git archive`. Each tree first runs the
search once untimed (its programs then sit in the persistent compile cache, as on a machine that
has run it before); then each round runs it once in each tree, in a fresh process each time and in
alternating order. Printed: every timing, each tree's median wall time, the speed-up (base /
this), and whether the two trees' critical_lr.csv and runs.csv are byte-identical (they are when
neither tree changed the numerics).
"""

import argparse
import filecmp
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ab import export

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configs import ladder  # noqa: E402 (this tree's ladder: the rung both trees search)


def search(tree: str, workdir: str, rung: tuple, dtype: str, workers: int) -> float:
  """Seconds of one `normstudy.sweep --search` of the ladder rung in `tree` into `workdir`."""
  spec = ladder.LADDER_SEARCH
  argv = [sys.executable, "-m", "normstudy.sweep", "--config=configs/ladder.py",
          f"--search={spec.field}:{spec.low:g},{spec.high:g}",
          f"--rounds={spec.rounds}", f"--probe_decades={spec.probe_decades:g}",
          f"--config.model.dtype={dtype}", f"--workdir={workdir}", f"--workers={workers}",
          *(f"--config.{k}={v}" for k, v in ladder.rung_overrides(*rung).items())]
  started = time.perf_counter()
  subprocess.run(argv, cwd=tree, check=True, capture_output=True,
                 env={**os.environ, "PYTHONPATH": tree})
  return time.perf_counter() - started


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--base", default="HEAD~1")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--workers", type=int, default=0, help="the sweeps' --workers")
  parser.add_argument("--rung", default="4,32", help="num_layers,d_model")
  parser.add_argument("--dtype", default="float16")
  args = parser.parse_args(argv)
  rung = tuple(int(x) for x in args.rung.split(","))
  with tempfile.TemporaryDirectory() as tmp:
    base_tree = os.path.join(tmp, "base")
    os.makedirs(base_tree)
    trees = {"base": export(args.base, base_tree), "this": ROOT}
    times = {name: [] for name in trees}
    outputs = {}
    for name, tree in trees.items():  # untimed: the programs into the compile cache
      outputs[name] = os.path.join(tmp, f"{name}_warm")
      search(tree, outputs[name], rung, args.dtype, args.workers)
    for r in range(args.rounds):
      order = list(trees) if r % 2 == 0 else list(trees)[::-1]
      for name in order:
        workdir = os.path.join(tmp, f"{name}_{r}")
        times[name].append(search(trees[name], workdir, rung, args.dtype, args.workers))
        print(f"round {r + 1} {name}: {times[name][-1]:.1f} s", flush=True)
    base, this = (statistics.median(times[n]) for n in ("base", "this"))
    print(f"rung {rung[0]} x {rung[1]} {args.dtype}, --workers={args.workers}, load at the end "
          f"{os.getloadavg()[0]:.1f}: base ({args.base}) {base:.1f} s, this {this:.1f} s, "
          f"speed-up {base / this:.2f}x")
    for table in ("critical_lr.csv", "runs.csv"):
      same = filecmp.cmp(os.path.join(outputs["base"], table),
                         os.path.join(outputs["this"], table), shallow=False)
      print(f"{table}: {'byte-identical' if same else 'DIFFERS'} between the trees")


if __name__ == "__main__":
  main()
