"""Where a train step's time goes: its top operations, compiled FLOPs and bytes, model FLOP rate.

  python benchmarks/profile.py [--size seed|S|M] [--dtype float16|bfloat16|float32]
                               [--steps 10] [--top 15] [--json out.json]

Times normstudy's engine as `normstudy.main` runs it (one run, K = 1) at one size: `seed` is the
seed figure's recipe (configs/seed_figure.py: 4-layer width-64 encoder, float16 by default), S and
M the sizes of benchmarks/throughput.py (decoder, float32 by default). It then traces --steps
steps with `jax.profiler` and reads the trace back (`jax.profiler.ProfileData`): XLA:CPU's thunk
runtime records one event per executed HLO operation. Printed:
  - ms per step (median of 20 untraced steps) and tokens/s;
  - the compiled step's cost analysis: FLOPs and bytes accessed, per step and per token;
  - the model FLOP rate (the matmul FLOPs of benchmarks/throughput.py's count / step time);
  - operation time per step by kind (the HLO fusion's name without its number: `ynn_fusion` =
    dots through XNNPACK/YNN, `copy_*`/`transpose_*` = layout changes, the rest elementwise and
    reductions), and the top --top single operations with the JAX operation they come from.
Operation times are summed over the threads that ran them, so their total can exceed the wall
time of a step when two cores work at once.
"""

import argparse
import collections
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import throughput  # noqa: E402
from normstudy.engine import execution  # noqa: E402
from normstudy.engine import sharding  # noqa: E402

SIZES = ("seed", "S", "M")
DTYPES = ("float16", "bfloat16", "float32")
# Events of the runtime itself, not of an HLO operation.
_RUNTIME_EVENT = re.compile(r"::|\(|^\$|^Pjit|^Thunk|^end: ")


def size_config(size: str, dtype: str | None):
  config = throughput.seed_config() if size == "seed" else throughput.size_config(size)
  if dtype:
    config.model.dtype = dtype
  return config


def _batch(config):
  if not config.model.causal:
    return throughput._encoder_batch(config)  # noqa: SLF001 (the benchmark's own helper)
  return {"tokens": np.asarray(throughput._batch(config)["tokens"])[None]}  # noqa: SLF001


def compiled_step(config):
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  program = execution.ProgramSteps(config, mesh, num_runs=1)
  state, step = program.initial([config]), program.train
  batch = sharding.global_batch(mesh, _batch(config))
  return step, state, batch


def _fusion_sources(hlo_text: str) -> dict:
  """HLO instruction name -> (result shape, the JAX operation it comes from). A fusion without
  metadata of its own (a layout copy) is named by its fused computation's root, else by the
  first operation in it that has some."""
  sources, calls, roots, computation = {}, {}, {}, None
  for line in hlo_text.splitlines():
    header = re.match(r"%?([\w.\-]+) .*\{$", line)
    if header and not line.startswith(" "):
      computation = header.group(1)
      continue
    match = re.match(r"\s*(ROOT )?%?([\w.\-]+) = (\S+)", line)
    if not match:
      continue
    op_name = re.search(r'op_name="([^"]*)"', line)
    origin = re.sub(r"^jit\([^)]*\)/", "", op_name.group(1)) if op_name else ""
    if origin and (match.group(1) or computation not in roots):
      roots[computation] = origin  # its root's, else its first operation's
    called = re.search(r"calls=%?([\w.\-]+)", line)
    if called:
      calls[match.group(2)] = called.group(1)
    sources.setdefault(match.group(2), (match.group(3), origin))
  return {name: (shape, origin or roots.get(calls.get(name), ""))
          for name, (shape, origin) in sources.items()}


def phase_of(origin: str) -> str:
  """The part of the step an operation belongs to, from its JAX operation's name."""
  if origin.startswith("transpose(jvp("):
    return "backward"
  if origin.startswith("jvp("):
    return "forward"
  return "optimizer, loss scale and the rest" if origin else "unattributed"


def operation_times(trace_dir: str, steps: int) -> collections.Counter:
  """ns per step of every HLO operation in the trace under `trace_dir`."""
  path = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0]
  profile = jax.profiler.ProfileData.from_file(path)
  times = collections.Counter()
  for plane in profile.planes:
    for line in plane.lines:
      if line.name == "python":
        continue
      for event in line.events:
        if not _RUNTIME_EVENT.search(event.name):
          times[event.name] += event.duration_ns / steps
  return times


def kind_of(operation: str) -> str:
  return re.sub(r"\.\d+$", "", operation)


def profile(size: str, dtype: str | None, steps: int) -> dict:
  config = size_config(size, dtype)
  step, state, batch = compiled_step(config)
  compiled = step.lower(state, batch).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  wall = []
  for _ in range(20):
    start = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    wall.append(time.perf_counter() - start)
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir)
    for _ in range(steps):
      state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
    jax.profiler.stop_trace()
    times = operation_times(trace_dir, steps)
  tokens = config.train.batch_size * config.model.max_len
  seconds = statistics.median(wall)
  by_kind = collections.Counter()
  for name, ns in times.items():
    by_kind[kind_of(name)] += ns
  return {"size": size, "dtype": config.model.dtype, "ms_per_step": 1e3 * seconds,
          "tokens_per_s": tokens / seconds, "flops_per_token": cost["flops"] / tokens,
          "bytes_per_token": cost["bytes accessed"] / tokens,
          "model_flops_per_s": throughput.model_flops_per_step(config) / seconds,
          "operations_per_step": len(times), "operation_ms_per_step": sum(times.values()) / 1e6,
          "by_kind": {k: v / 1e6 for k, v in by_kind.most_common()},
          "_hlo": compiled.as_text(), "_times": times}


def report(result: dict, top: int) -> dict:
  sources = _fusion_sources(result.pop("_hlo"))
  times = result.pop("_times")
  result["top"] = [{"operation": name, "ms": ns / 1e6, "shape": sources.get(name, ("?", ""))[0],
                    "from": sources.get(name, ("", "?"))[1]}
                   for name, ns in times.most_common(top)]
  phases, counts = collections.Counter(), collections.Counter()
  for name, ns in times.items():
    phase = phase_of(sources.get(name, ("", ""))[1])
    phases[phase] += ns / 1e6
    counts[phase] += 1
  result["by_phase"] = {p: {"ms": ms, "operations": counts[p]} for p, ms in phases.most_common()}
  r = result
  print(f"size {r['size']}, {r['dtype']}: {r['ms_per_step']:.1f} ms/step, "
        f"{r['tokens_per_s']:.0f} tokens/s, model FLOP rate {r['model_flops_per_s'] / 1e9:.1f} "
        f"GFLOP/s")
  print(f"compiled: {r['flops_per_token'] / 1e3:.1f} kFLOP and {r['bytes_per_token'] / 1e3:.1f} "
        f"kB accessed per token; {r['operations_per_step']} operations per step, "
        f"{r['operation_ms_per_step']:.1f} ms of operation time per step")
  total = r["operation_ms_per_step"]
  print(f"\n{'phase':<34}{'ms/step':>9}{'share':>8}{'operations':>12}")
  for phase, row in r["by_phase"].items():
    print(f"{phase:<34}{row['ms']:>9.2f}{row['ms'] / total:>8.1%}{row['operations']:>12}")
  print(f"\n{'kind':<34}{'ms/step':>9}{'share':>8}")
  for kind, ms in list(r["by_kind"].items())[:12]:
    print(f"{kind:<34}{ms:>9.2f}{ms / total:>8.1%}")
  print(f"\n{'operation':<30}{'ms/step':>9}  {'shape':<22}from")
  for row in r["top"]:
    print(f"{row['operation']:<30}{row['ms']:>9.2f}  {row['shape']:<22}{row['from'][:70]}")
  return r


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", default="seed", help="one of: " + ", ".join(SIZES))
  parser.add_argument("--dtype", default=None,
                      help="one of: " + ", ".join(DTYPES) + " (default: the size's own)")
  parser.add_argument("--steps", type=int, default=10, help="traced steps")
  parser.add_argument("--top", type=int, default=15, help="single operations listed")
  parser.add_argument("--json", default=None, help="also write the figures to this file")
  args = parser.parse_args(argv)
  if args.size not in SIZES:
    sys.exit(f"error: --size={args.size} is not one of: {', '.join(SIZES)}")
  if args.dtype is not None and args.dtype not in DTYPES:
    sys.exit(f"error: --dtype={args.dtype} is not one of: {', '.join(DTYPES)}")
  if args.steps < 1 or args.top < 1:
    sys.exit(f"error: --steps={args.steps} and --top={args.top} must be at least 1")
  result = report(profile(args.size, args.dtype, args.steps), args.top)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
