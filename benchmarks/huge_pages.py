"""What glibc's huge pages tunable would do for normstudy's train step: time, page faults, memory
and bits, with it and without it, in one sitting.

  python benchmarks/huge_pages.py [--sizes seed,S,M] [--rounds 3] [--blocks 4] [--json out.json]

XLA:CPU allocates a program's temporary buffers anew at every execution, most of them in one
block above glibc's largest mmap threshold (32 MiB), which glibc maps and unmaps each time, so
each execution faults its working set in 4 KiB at a time. `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`
(glibc 2.35) has malloc ask for transparent huge pages on such maps. Each round trains every size
once with it (`hugetlb=1`) and once with glibc's default (`hugetlb=0`), each in a fresh process,
in alternating order. A process trains as `normstudy.main` does, in blocks of
train.steps_per_dispatch (16) steps in one compiled loop: one block to compile, then --blocks
timed blocks; then 16 steps one per dispatch (how an evaluation, a telemetry step or the locate
pass runs). Printed per size, medians over rounds: ms per step both ways, minor page faults per
step (getrusage), the process's peak resident memory, and whether the parameters after the
blocks are the same bits both ways (a SHA-256 of them). `seed` is the seed figure's recipe
(float16 encoder, width 64, 4 layers), S and M the float32 decoders of benchmarks/throughput.py.
normstudy does not set the tunable (docs/throughput.md says why).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = ("seed", "S", "M")
SETTINGS = {"hugetlb=1": "glibc.malloc.hugetlb=1", "hugetlb=0": "glibc.malloc.hugetlb=0"}


def train(size: str, blocks: int) -> dict:
  """The child process at `size`: one block to compile, `blocks` timed blocks, then 16 steps one
  per dispatch (the first compiles)."""
  import hashlib
  import resource
  import time
  sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import throughput  # pylint: disable=import-outside-toplevel

  config = throughput.seed_config() if size == "seed" else throughput.size_config(size)
  engine = throughput.EngineSteps(config)
  length = engine.length

  def timed(fn, calls):
    """Seconds of each call after the first (which compiles), and the page faults they took."""
    times, faults = [], 0
    for index in range(calls + 1):
      before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
      fn()
      if index > 0:
        times.append(time.perf_counter() - start)
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return times, faults

  times, faults = timed(engine.block, blocks)
  times = [t / length for t in times]
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(engine.params()):
    digest.update(np.asarray(leaf).tobytes())
  one_times, one_faults = timed(engine.one_step, length)
  return {"ms_per_step": 1e3 * statistics.median(times),
          "faults_per_step": faults / (blocks * length),
          "one_step_ms": 1e3 * statistics.median(one_times), "one_step_faults": one_faults / length,
          "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
          "params_sha256": digest.hexdigest()}


def run_child(size: str, blocks: int, tunables: str) -> dict:
  env = dict(os.environ, GLIBC_TUNABLES=tunables)
  done = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", size,
                         "--blocks", str(blocks)], cwd=ROOT, env=env, capture_output=True,
                        text=True, check=False)
  if done.returncode != 0:
    raise RuntimeError(f"{size} with {tunables} exited {done.returncode}:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="seed,S,M", help="comma-separated, from: seed, S, M")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--blocks", type=int, default=4, help="timed blocks of 16 steps")
  parser.add_argument("--json", default=None, help="also write the figures to this file")
  parser.add_argument("--_child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args._child:
    print(json.dumps(train(args._child, args.blocks)), flush=True)
    return
  sizes = args.sizes.split(",")
  problems = [f"--sizes {s!r} (allowed: {', '.join(SIZES)})" for s in sizes if s not in SIZES]
  if args.rounds < 1 or args.blocks < 1:
    problems.append(f"--rounds {args.rounds} / --blocks {args.blocks} (at least 1 each)")
  if problems:
    sys.exit("error: " + "; ".join(problems))
  load = os.getloadavg()
  print(f"load at the start: {load[0]:.2f} (1 min); {len(os.sched_getaffinity(0))} CPUs",
        flush=True)
  figures = {size: {name: [] for name in SETTINGS} for size in sizes}
  for round_index in range(args.rounds):
    order = list(SETTINGS) if round_index % 2 == 0 else list(SETTINGS)[::-1]
    for size in sizes:
      for name in order:
        result = run_child(size, args.blocks, SETTINGS[name])
        figures[size][name].append(result)
        print(f"round {round_index + 1}/{args.rounds} {size} {name}: blocks "
              f"{result['ms_per_step']:.1f} ms/step ({result['faults_per_step']:.0f} faults), "
              f"one step {result['one_step_ms']:.1f} ms ({result['one_step_faults']:.0f} "
              f"faults), peak {result['peak_rss_mib']:.0f} MiB", flush=True)
  print(f"\nload at the end: {os.getloadavg()[0]:.2f} (1 min)")
  print(f"\nmedians over {args.rounds} round(s)")
  print("ms/step and minor page faults per step, hugetlb=0 -> hugetlb=1; speed-up = 0 / 1")
  print(f"{'size':<6}{'mode':<10}{'ms/step':>17}{'speed-up':>10}{'faults/step':>18}"
        f"{'faster in':>11}")
  summary = {}
  for size in sizes:
    runs = figures[size]
    digests = {r["params_sha256"] for name in runs for r in runs[name]}
    rss = {name: statistics.median(r["peak_rss_mib"] for r in runs[name]) for name in runs}
    summary[size] = {"same_bits": len(digests) == 1, "peak_rss_mib": rss}
    for mode, ms_key, fault_key in (("blocks", "ms_per_step", "faults_per_step"),
                                    ("one step", "one_step_ms", "one_step_faults")):
      med = {name: {key: statistics.median(r[key] for r in runs[name])
                    for key in (ms_key, fault_key)} for name in runs}
      off, on = med["hugetlb=0"], med["hugetlb=1"]
      faster = sum(a[ms_key] > b[ms_key] for a, b in zip(runs["hugetlb=0"], runs["hugetlb=1"]))
      speed_up = off[ms_key] / on[ms_key]
      summary[size][mode] = {"medians": med, "speed_up": speed_up, "rounds_faster": faster}
      print(f"{size:<6}{mode:<10}{off[ms_key]:>8.1f} ->{on[ms_key]:>7.1f}{speed_up:>9.2f}x"
            f"{off[fault_key]:>9.0f} ->{on[fault_key]:>7.0f}{faster:>6} of {args.rounds}")
    print(f"{'':<6}peak memory {rss['hugetlb=0']:.0f} -> {rss['hugetlb=1']:.0f} MiB; the same "
          f"bits both ways: {'yes' if len(digests) == 1 else 'NO'}")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"rounds": figures, "summary": summary, "load_start": load,
                 "load_end": os.getloadavg()}, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
