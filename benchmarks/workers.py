"""Programs of a sweep side by side in worker processes against one after another in one process.

  python benchmarks/workers.py [--size seed] [--runs 2] [--steps 60] [--workers 2]
                               [--pin late|early|none]

Two ways to train --workers programs of --runs runs each (benchmarks/sweep.py's `train`: the data
pipeline, one program per group of runs as the sweep trains it):
  one process   the programs one after another in this process, which may use every core
  workers       one process per program, all at once, each pinned to its own share of the cores
                (os.sched_setaffinity), each compiling its program and training it; --pin late
                (normstudy.experiments.workers): pinned after XLA started on every core, so its thread pool
                and its results are one process's; early: pinned before, a pool per share;
                none: not pinned (each pool as large as the machine, the threads unbound)
Printed: steady-state run-steps per second (from the median step time of every program; for the
workers, summed over the programs training together) and the wall time including compilation,
and the ratio workers / one process. normstudy.sweep would gain from workers where the ratio is
well above 1 (docs/throughput.md's rule: at least 1.25x).
"""

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _worker(cores, size, runs, steps, data_dir, index, out, pin):
  if pin == "late":
    import jax  # noqa: PLC0415
    jax.devices()  # XLA sizes its thread pool by the cores this process may use now
  if pin != "none":
    os.sched_setaffinity(0, cores)
  sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
  import sweep  # noqa: PLC0415 (imported after pinning)
  configs = sweep.run_configs(size, 2 * runs, data_dir)[index * runs:(index + 1) * runs]
  out.put({"index": index, "step_s": sweep.train(configs, steps)["step_s"]})


def workers(size, runs, steps, count, data_dir, pin="late") -> dict:
  cores = sorted(os.sched_getaffinity(0))
  shares = [cores[i::count] for i in range(count)]
  context = multiprocessing.get_context("spawn")
  out = context.Queue()
  start = time.perf_counter()
  procs = [context.Process(target=_worker, args=(shares[i], size, runs, steps, data_dir, i, out, pin))
           for i in range(count)]
  for proc in procs:
    proc.start()
  results = [out.get() for _ in procs]
  for proc in procs:
    proc.join()
  return {"run_steps_per_s": sum(runs / r["step_s"] for r in results),
          "wall_s": time.perf_counter() - start}


def one_process(size, runs, steps, count, data_dir) -> dict:
  sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
  import sweep  # noqa: PLC0415
  configs = sweep.run_configs(size, 2 * runs, data_dir)
  start = time.perf_counter()
  step_s = [sweep.train(configs[i * runs:(i + 1) * runs], steps)["step_s"] for i in range(count)]
  return {"run_steps_per_s": count * runs / sum(step_s), "wall_s": time.perf_counter() - start}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", default="seed", help="seed, S or M")
  parser.add_argument("--runs", type=int, default=2, help="runs per program")
  parser.add_argument("--steps", type=int, default=60, help="timed steps per program")
  parser.add_argument("--workers", type=int, default=2, help="programs, one per worker")
  parser.add_argument("--pin", default="late", choices=("late", "early", "none"),
                      help="pin each worker after XLA starts (normstudy.experiments.workers), before, or not")
  parser.add_argument("--json", default=None, help="also write the figures to this file")
  args = parser.parse_args(argv)
  cores = len(os.sched_getaffinity(0))
  if args.size not in ("seed", "S", "M"):
    sys.exit(f"error: --size={args.size} is not one of: seed, S, M")
  if args.workers < 2 or args.workers > cores or args.runs < 1 or args.steps < 3:
    sys.exit(f"error: --workers={args.workers} must be 2..{cores} (the cores this process may "
             f"use), --runs >= 1, --steps >= 3")
  if args.workers > 2:
    sys.exit(f"error: --workers={args.workers}: run_configs gives two programs' worth of runs")
  data_dir = tempfile.mkdtemp(prefix="normstudy_workers_bench_")
  # The data is generated once, before anything is timed.
  sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
  import sweep  # noqa: PLC0415
  sweep.train(sweep.run_configs(args.size, 2, data_dir)[:1], 2)
  side = workers(args.size, args.runs, args.steps, args.workers, data_dir, args.pin)
  alone = one_process(args.size, args.runs, args.steps, args.workers, data_dir)
  ratio = side["run_steps_per_s"] / alone["run_steps_per_s"]
  print(f"{cores} cores, size {args.size}, {args.workers} programs of {args.runs} runs, "
        f"{args.steps} steps each, workers pinned {args.pin}")
  print(f"{'':<14}{'run-steps/s':>12}{'wall s':>9}")
  print(f"{'one process':<14}{alone['run_steps_per_s']:>12.1f}{alone['wall_s']:>9.1f}")
  print(f"{'workers':<14}{side['run_steps_per_s']:>12.1f}{side['wall_s']:>9.1f}")
  print(f"workers / one process: {ratio:.2f}x run-steps/s, "
        f"{alone['wall_s'] / side['wall_s']:.2f}x wall")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"cores": cores, "size": args.size, "runs": args.runs, "steps": args.steps,
                 "pin": args.pin,
                 "one_process": alone, "workers": side, "ratio": ratio}, f, indent=2)


if __name__ == "__main__":
  main()
