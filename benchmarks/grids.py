"""How should a grid's runs share programs and cores? Runs of one structure in one program
against one after another, and programs side by side in worker processes against one process.

  python benchmarks/grids.py [programs] [--runs 8] [--steps 40] [--sizes seed,S] [--json F]
                            [--memory_runs 16] [--program_sizes 2,18,36]
  python benchmarks/grids.py workers [--size seed] [--runs 2] [--steps 60] [--workers 2]

programs: K runs in one program (as the sweep trains them) against them one after another.

For each size, K runs (learning rates 1e-3 and 3e-3 times seeds 0..K/2-1) are trained:
  sweep        one program as normstudy.sweep trains it: on the CPU its runs step one at a time
               through the one-run program (normstudy.engine.execution), elsewhere vmapped
  vmapped      one program, the K states stacked, one vmapped K-run step (forced)
  sequential   K programs one after another, each a single run (normstudy.main's step)
All read their batches from the data pipeline, as the commands do. Printed per size: the
steady-state throughput in run-steps per second (median step time after compilation) and the
wall time of the whole job including each program's compilation, with ratios to sequential.
Then the peak memory (max RSS) of a K = --memory_runs sweep at the seed figure's size, as the
sweep trains it and vmapped, each measured in a subprocess. Compilation here is cold: no
persistent compilation cache.

workers: A sweep's programs side by side in worker processes against one after another.

Two ways to train --workers programs of --runs runs each (`programs`' `train`: the data
pipeline, one program per group of runs as the sweep trains it):
  one process   the programs one after another in this process, which may use every core
  workers       one process per program, all at once, each pinned to its own share of the cores
                (os.sched_setaffinity), each compiling its program and training it; --pin late
                (normstudy.experiments.workers): pinned after XLA started on every core, so its
                thread pool and its results are one process's; early: pinned before, a pool per
                share; none: not pinned (each pool as large as the machine, the threads unbound)
Printed: steady-state run-steps per second (from the median step time of every program; for the
workers, summed over the programs training together) and the wall time including compilation,
and the ratio workers / one process. normstudy.sweep would gain from workers where the ratio is
well above 1 (docs/throughput.md's rule: at least 1.25x).
"""

import argparse
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs import benchmark as benchmark_sizes  # noqa: E402
from configs import seed_figure  # noqa: E402
from normstudy.data import batches as batches_lib  # noqa: E402
from normstudy.data import sources as data_lib  # noqa: E402
from normstudy.engine import execution  # noqa: E402
from normstudy.engine import sharding  # noqa: E402
from normstudy.engine import timing  # noqa: E402

# Each subcommand's question (its --help): the first line of its part of the docstring.
_QUESTIONS = {name: re.search(rf"^{name}: (.*)$", __doc__, re.M).group(1)
              for name in ("programs", "workers")}



# ---- programs ----------------------------------------------------------------------------------

def base_config(size: str, data_dir: str):
  config = (seed_figure.get_config("pre_norm_clip1") if size == "seed"
            else benchmark_sizes.get_config(size))
  config.data.update(data_dir=data_dir, train_tokens=2**17, validation_tokens=2**14)
  return config


def run_configs(size: str, k: int, data_dir: str) -> list:
  return timing.grid_runs(base_config(size, data_dir), k)


def train(configs, steps: int, vmapped=None) -> dict:
  """Trains `configs` as one program for `steps` steps (`vmapped`: True or False forces how its
  runs step, None lets normstudy.engine.execution choose as a sweep does):
  wall time (compilation included) and the median step time after compilation."""
  start = time.perf_counter()
  mesh = sharding.make_mesh(configs[0].mesh, jax.devices()[:1])
  program = execution.ProgramSteps(configs[0], mesh, len(configs),
                                   one_at_a_time=None if vmapped is None else not vmapped)
  state, step = program.initial(configs), program.train
  splits = data_lib.load_splits(configs[0])
  datasets = [batches_lib.train_batches(c, splits) for c in configs]
  times = []
  for i in range(steps):
    tick = time.perf_counter()
    batch = {key: np.stack([d[i][key] for d in datasets]) for key in datasets[0][i]}
    state, metrics = step(state, sharding.global_batch(mesh, batch))
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - tick)
  return {"wall_s": time.perf_counter() - start, "step_s": statistics.median(times[1:])}


def compare(size: str, k: int, steps: int, data_dir: str) -> dict:
  configs = run_configs(size, k, data_dir)
  swept = train(configs, steps)
  vmapped = train(configs, steps, vmapped=True)
  alone = [train([config], steps) for config in configs]
  sequential = {"wall_s": sum(a["wall_s"] for a in alone),
                "step_s": statistics.median(a["step_s"] for a in alone)}
  row = {"size": size, "runs": k, "steps": steps,
         "sweep_run_steps_per_s": k / swept["step_s"],
         "vmapped_run_steps_per_s": k / vmapped["step_s"],
         "sequential_run_steps_per_s": 1 / sequential["step_s"],
         "sweep_wall_s": swept["wall_s"], "vmapped_wall_s": vmapped["wall_s"],
         "sequential_wall_s": sequential["wall_s"]}
  row["throughput_ratio"] = row["sweep_run_steps_per_s"] / row["sequential_run_steps_per_s"]
  row["vmapped_throughput_ratio"] = (row["vmapped_run_steps_per_s"]
                                     / row["sequential_run_steps_per_s"])
  row["wall_ratio"] = row["sequential_wall_s"] / row["sweep_wall_s"]
  row["vmapped_wall_ratio"] = row["sequential_wall_s"] / row["vmapped_wall_s"]
  return row


def program_size_costs(size: str, ks: list, steps: int, data_dir: str) -> list:
  """The cost of one run-step (step time / K) of a single program of K runs, for each K: where
  stacking more runs stops paying (normstudy.experiments.grid.MAX_RUNS_PER_PROGRAM)."""
  rows = []
  for k in ks:
    timing = train(run_configs(size, k, data_dir), steps)
    rows.append({"size": size, "runs": k, "ms_per_run_step": 1e3 * timing["step_s"] / k})
    print(f"{size:<6}{k:>4}{rows[-1]['ms_per_run_step']:>18.1f}", flush=True)
  return rows


def peak_memory(k: int, data_dir: str, vmapped=None) -> float:
  """Max RSS (GiB) of a process training a K-run sweep at the seed figure's size for 5 steps."""
  code = (f"import sys; sys.path.insert(0, {os.path.join(ROOT, 'benchmarks')!r}); "
          f"import grids; grids.train(grids.run_configs('seed', {k}, {data_dir!r}), 5, "
          f"vmapped={vmapped})")
  process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  _, status, usage = os.wait4(process.pid, 0)  # this child's own peak, not the largest child's
  if os.waitstatus_to_exitcode(status):
    raise RuntimeError(f"the {k}-run memory check failed: {code}")
  return usage.ru_maxrss / 2**20


def programs(argv=None):
  parser = argparse.ArgumentParser(prog="grids.py programs", description=_QUESTIONS["programs"])
  parser.add_argument("--runs", type=int, default=8, help="K, even")
  parser.add_argument("--steps", type=int, default=40, help="steps per run")
  parser.add_argument("--sizes", default="seed,S", help="comma-separated, from: seed, S, M")
  parser.add_argument("--memory_runs", type=int, default=16,
                      help="K for the memory check (0: skip)")
  parser.add_argument("--json", default="benchmarks/grids.json", help="output file")
  parser.add_argument("--program_sizes", default="",
                      help="comma-separated K (even): only time one K-run program per K at the "
                           "first size, as ms per run-step")
  args = parser.parse_args(argv)
  if args.program_sizes:
    ks = [int(k) for k in args.program_sizes.split(",")]
    if any(k < 2 or k % 2 for k in ks):
      sys.exit("error: --program_size_costs must be even numbers >= 2")
    print(f"{'size':<6}{'K':>4}{'ms per run-step':>18}")
    rows = program_size_costs(args.sizes.split(",")[0], ks, args.steps,
                         tempfile.mkdtemp(prefix="normstudy_sweep_bench_"))
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"device": str(jax.devices()[0]), "jax": jax.__version__, "rows": rows}, f,
                indent=2)
    return
  if args.runs < 2 or args.runs % 2 or args.steps < 3:
    sys.exit("error: --runs must be even and >= 2, --steps >= 3")
  data_dir = tempfile.mkdtemp(prefix="normstudy_sweep_bench_")
  rows = []
  print("run-steps per second (ratio to sequential), then wall seconds (sequential / it)")
  print(f"{'size':<6}{'K':>3}{'sweep':>16}{'vmapped':>16}{'sequential':>11}"
        f"{'sweep wall':>17}{'vmapped':>16}{'sequential':>11}")
  for size in args.sizes.split(","):
    row = compare(size, args.runs, args.steps, data_dir)
    rows.append(row)
    print(f"{size:<6}{args.runs:>3}"
          f"{row['sweep_run_steps_per_s']:>9.1f} ({row['throughput_ratio']:.2f}x)"
          f"{row['vmapped_run_steps_per_s']:>9.1f} ({row['vmapped_throughput_ratio']:.2f}x)"
          f"{row['sequential_run_steps_per_s']:>11.1f}"
          f"{row['sweep_wall_s']:>10.1f} ({row['wall_ratio']:.2f}x)"
          f"{row['vmapped_wall_s']:>9.1f} ({row['vmapped_wall_ratio']:.2f}x)"
          f"{row['sequential_wall_s']:>11.1f}", flush=True)
  results = {"device": str(jax.devices()[0]), "jax": jax.__version__, "rows": rows}
  if args.memory_runs:
    results["peak_rss_gib"] = peak_memory(args.memory_runs, data_dir)
    results["vmapped_peak_rss_gib"] = peak_memory(args.memory_runs, data_dir, vmapped=True)
    print(f"peak memory of a {args.memory_runs}-run sweep at the seed size: "
          f"{results['peak_rss_gib']:.2f} GiB as the sweep trains it, "
          f"{results['vmapped_peak_rss_gib']:.2f} GiB vmapped (max RSS)")
  with open(args.json, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=2)
  print(f"wrote {args.json}")


# ---- workers -----------------------------------------------------------------------------------

def _worker(cores, size, runs, steps, data_dir, index, out, pin):
  if pin == "late":
    import jax  # noqa: PLC0415
    jax.devices()  # XLA sizes its thread pool by the cores this process may use now
  if pin != "none":
    os.sched_setaffinity(0, cores)
  sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
  import grids  # noqa: PLC0415 (this script, imported in the worker after pinning)
  configs = grids.run_configs(size, 2 * runs, data_dir)[index * runs:(index + 1) * runs]
  out.put({"index": index, "step_s": grids.train(configs, steps)["step_s"]})


def _in_workers(size, runs, steps, count, data_dir, pin="late") -> dict:
  cores = sorted(os.sched_getaffinity(0))
  shares = [cores[i::count] for i in range(count)]
  context = multiprocessing.get_context("spawn")
  out = context.Queue()
  start = time.perf_counter()
  procs = [context.Process(target=_worker,
                           args=(shares[i], size, runs, steps, data_dir, i, out, pin))
           for i in range(count)]
  for proc in procs:
    proc.start()
  results = [out.get() for _ in procs]
  for proc in procs:
    proc.join()
  return {"run_steps_per_s": sum(runs / r["step_s"] for r in results),
          "wall_s": time.perf_counter() - start}


def one_process(size, runs, steps, count, data_dir) -> dict:
  configs = run_configs(size, 2 * runs, data_dir)
  start = time.perf_counter()
  step_s = [train(configs[i * runs:(i + 1) * runs], steps)["step_s"] for i in range(count)]
  return {"run_steps_per_s": count * runs / sum(step_s), "wall_s": time.perf_counter() - start}


def workers_vs_one(argv=None):
  parser = argparse.ArgumentParser(prog="grids.py workers", description=_QUESTIONS["workers"])
  parser.add_argument("--size", default="seed", help="seed, S or M")
  parser.add_argument("--runs", type=int, default=2, help="runs per program")
  parser.add_argument("--steps", type=int, default=60, help="timed steps per program")
  parser.add_argument("--workers", type=int, default=2, help="programs, one per worker")
  parser.add_argument("--pin", default="late", choices=("late", "early", "none"),
                      help="pin each worker after XLA starts (normstudy.experiments.workers), "
                           "before, or not")
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
  train(run_configs(args.size, 2, data_dir)[:1], 2)
  side = _in_workers(args.size, args.runs, args.steps, args.workers, data_dir, args.pin)
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


COMMANDS = {"programs": programs, "workers": workers_vs_one}


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  command = argv.pop(0) if argv and argv[0] in COMMANDS else "programs"
  COMMANDS[command](argv)


if __name__ == "__main__":
  main()
