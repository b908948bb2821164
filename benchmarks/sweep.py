"""K runs in one program (as the sweep trains them) against the same K runs one after another.

  python benchmarks/sweep.py [--runs 8] [--steps 40] [--sizes seed,S] [--json out.json]
                             [--memory_runs 16] [--program_sizes 2,18,36]

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
"""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from normstudy.data import sources as data_lib  # noqa: E402

from normstudy.data import batches as batches_lib
from normstudy.engine import execution  # noqa: E402
from normstudy.engine import sharding  # noqa: E402


def _seed_figure(variant="pre_norm_clip1"):
  from configs import seed_figure
  return seed_figure.get_config(variant)


def base_config(size: str, data_dir: str):
  if size == "seed":
    config = _seed_figure()
  else:
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import throughput
    config = throughput.size_config(size)
  config.data.update(data_dir=data_dir, train_tokens=2**17, validation_tokens=2**14)
  return config


def run_configs(size: str, k: int, data_dir: str) -> list:
  configs = []
  for lr in (1e-3, 3e-3):
    for seed in range(k // 2):
      config = copy.deepcopy(base_config(size, data_dir))
      config.optimizer.learning_rate, config.train.seed = lr, seed
      configs.append(config)
  return configs


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


def program_sizes(size: str, ks: list, steps: int, data_dir: str) -> list:
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
          f"import sweep; sweep.train(sweep.run_configs('seed', {k}, {data_dir!r}), 5, "
          f"vmapped={vmapped})")
  process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  _, status, usage = os.wait4(process.pid, 0)  # this child's own peak, not the largest child's
  if os.waitstatus_to_exitcode(status):
    raise RuntimeError(f"the {k}-run memory check failed: {code}")
  return usage.ru_maxrss / 2**20


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", type=int, default=8, help="K, even")
  parser.add_argument("--steps", type=int, default=40, help="steps per run")
  parser.add_argument("--sizes", default="seed,S", help="comma-separated, from: seed, S, M")
  parser.add_argument("--memory_runs", type=int, default=16, help="K for the memory check (0: skip)")
  parser.add_argument("--json", default="benchmarks/sweep.json", help="output file")
  parser.add_argument("--program_sizes", default="",
                      help="comma-separated K (even): only time one K-run program per K at the "
                           "first size, as ms per run-step")
  args = parser.parse_args(argv)
  if args.program_sizes:
    ks = [int(k) for k in args.program_sizes.split(",")]
    if any(k < 2 or k % 2 for k in ks):
      sys.exit("error: --program_sizes must be even numbers >= 2")
    print(f"{'size':<6}{'K':>4}{'ms per run-step':>18}")
    rows = program_sizes(args.sizes.split(",")[0], ks, args.steps,
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


if __name__ == "__main__":
  main()
