"""How fast is normstudy's train step on this machine, and where does its time go?

  python benchmarks/throughput.py [throughput] [--steps 20] [--sizes S,M] [--json out.json]
                             [--telemetry_every 10] [--no-placements]       (make benchmark)
  python benchmarks/throughput.py profile [--size seed|S|M] [--dtype ...] [--steps 10] [--top 15]
  python benchmarks/throughput.py dispatch [--per_dispatch 1,16] [--steps 300] [--rounds 3]
  python benchmarks/throughput.py peers --torch_python PATH [--nanodo_root DIR] [--sizes S,M]

The sizes S and M are configs/benchmark.py's, the seed size configs/seed_figure.py's; the timing
helpers are the package's (normstudy.engine.timing). Each subcommand's question:

throughput: Training-step throughput and model FLOP utilisation (MFU) at two fixed sizes, and every
placement in float16 and float32 at the seed figure's size.

  python benchmarks/throughput.py throughput [--steps 20] [--sizes S,M] [--json out.json]
                                 [--telemetry_every 10] [--no-placements]

Three steps are timed per size, all decoder-only, float32, Adam, clip 1.0, same FLOPs, with the
model the peer harness (../shared/peer) times: tanh GELU, no biases, learned positions:
  plain      a minimal hand-written JAX transformer step (fused qkv, list of layers): the yardstick
  unrolled   normstudy's engine as normstudy.main runs it (one run, K = 1), scan_layers=False
  scanned    the same with scan_layers=True (the default, scan_layers=None, unrolls both sizes)
With --placements it also times the seed figure's recipe (configs/seed_figure.py) for every
registered placement in float16 and float32, scanned and unrolled: the float16 Post-LN slowdown
of unrolled stacks (docs/throughput.md) must not come back unseen.

MFU = model FLOPs per step / step time / the dense float32 matmul rate measured in this same
process (2048^3, jitted, median), so the figure is relative to what this machine can do now.
Model FLOPs count every matmul of the forward pass (q, k, v, out, fc1, fc2, the scores and the
attention-weighted sum over the full length, the output head) and 2x that for the backward pass.

profile: Where a train step's time goes: its top operations, compiled FLOPs and bytes, FLOP rate.

  python benchmarks/throughput.py profile [--size seed|S|M] [--dtype float16|bfloat16|float32]
                               [--steps 10] [--top 15] [--json out.json]

Times normstudy's engine as `normstudy.main` runs it (one run, K = 1) at one size: `seed` is the
seed figure's recipe (configs/seed_figure.py: 4-layer width-64 encoder, float16 by default), S and
M the sizes of configs/benchmark.py (decoder, float32 by default). It then traces --steps
steps with `jax.profiler` and reads the trace back (`jax.profiler.ProfileData`): XLA:CPU's thunk
runtime records one event per executed HLO operation. Printed:
  - ms per step (median of 20 untraced steps) and tokens/s;
  - the compiled step's cost analysis: FLOPs and bytes accessed, per step and per token;
  - the model FLOP rate (the matmul FLOPs of configs/benchmark.py's count / step time);
  - operation time per step by kind (the HLO fusion's name without its number: `ynn_fusion` =
    dots through XNNPACK/YNN, `copy_*`/`transpose_*` = layout changes, the rest elementwise and
    reductions), and the top --top single operations with the JAX operation they come from.
Operation times are summed over the threads that ran them, so their total can exceed the wall
time of a step when two cores work at once.

dispatch: Steps per dispatch: the train loop stepping one step per host round trip against blocks of
steps in one compiled loop (train.steps_per_dispatch), as `normstudy.main` runs it.

  python benchmarks/throughput.py dispatch [--per_dispatch 1,16] [--steps 300] [--rounds 3]
                                [--config configs/survival.py:pre_norm_clip1]

Each round trains the same run once per setting, each in a fresh process, alternating (the
machine's speed drifts; alternation spreads the drift over both sides), with the persistent
compilation cache of the first round. A timing is the run's steady state: the median of its
records' tokens/s after step 60 (the first records hold the compilation), as steps per second.
The run is the survival recipe's (configs/survival.py: float16 seed recipe, constant learning
rate 0.01 after a 20-step warm-up, records every 5 steps, telemetry every 50, an evaluation and
checkpoint at the end). Printed: each setting's median over rounds and the speed-up against the
first setting; then whether the two settings' records are equal (they are bit for bit).

peers: normstudy's training step against the peers' (../shared/peer: PyTorch eager, nanodo) at the
sizes S and M, in one sitting: each round runs every contender once per size, each in a fresh
process, in alternating order (the machine's speed drifts; alternation spreads the drift over
every side).

  python benchmarks/throughput.py peers --torch_python PATH [--nanodo_root DIR] [--sizes S,M]
                             [--rounds 3] [--steps 25] [--json out.json]

`--torch_python`: a Python with torch and numpy (../shared/peer/README.md: `python3 -m venv
.peer-venv && .peer-venv/bin/pip install torch numpy`, outside the repo). `--nanodo_root`: an
export of nanodo's repository (optional: without it nanodo is not timed).

All sides time the same model (configs/benchmark.py's sizes: float32 decoder, Adam(W),
clip 1.0) the same way (../shared/peer/cpumon.py): per-call times, counting only calls during
which other processes used less than 0.15 of a core, the median of each window of 25 such
steps. normstudy is timed as `normstudy.main` trains: blocks of train.steps_per_dispatch (16)
steps in one compiled loop, each block's batches staged from the host and its metrics fetched
back (one block is one timed call, its time spread evenly over its steps), and, for
reference, one step per dispatch. Printed: each round's tokens/s, then the median over rounds
of each contender, normstudy's ratio to each peer (of those medians, and each round's ratio
with their median: a round's contenders ran minutes apart, so its ratio is the paired one), and
the machine's load when the sitting started and ended; --json writes every figure.
"""

import argparse
import collections
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs import benchmark as benchmark_sizes  # noqa: E402
from configs import seed_figure  # noqa: E402
from normstudy.core import placements  # noqa: E402
from normstudy.engine import execution  # noqa: E402
from normstudy.engine import sharding  # noqa: E402
from normstudy.engine import timing  # noqa: E402

# Each subcommand's question (its --help): the first line of its part of the docstring.
_QUESTIONS = {name: re.search(rf"^{name}: (.*)$", __doc__, re.M).group(1)
              for name in ("throughput", "profile", "dispatch", "peers")}



# ---- throughput -------------------------------------------------------------------------------

def telemetry_overhead(config, steps: int, every: int) -> tuple[float, float]:
  """(seconds per step without telemetry, with telemetry every `every` steps), each the mean
  over the same number of steps, so the occasional telemetry step is counted at its weight: the
  loop's two compiled steps (normstudy.engine.execution) on one device."""
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  program = execution.ProgramSteps(config, mesh, num_runs=1)
  plain_step, telemetry_step = program.train, program.telemetry
  batch = sharding.global_batch(mesh, jax.tree.map(lambda x: np.asarray(x)[None],
                                                  timing.token_batch(config)))
  state = program.initial([config])
  for fn in (plain_step, telemetry_step):  # compile both
    state, metrics = fn(state, batch)
    jax.block_until_ready(metrics)
  steps = max(every, steps // every * every)
  results = []
  for with_telemetry in (False, True, False, True):  # interleaved: the machine is shared
    start = time.perf_counter()
    for i in range(1, steps + 1):
      fn = telemetry_step if with_telemetry and i % every == 0 else plain_step
      state, metrics = fn(state, batch)
      jax.device_get(metrics)  # the training loop fetches every step's metrics too
    results.append((time.perf_counter() - start) / steps)
  return min(results[0], results[2]), min(results[1], results[3])


def plain_step_seconds(config, steps: int) -> list[float]:
  """Seconds per step of a minimal pre-LN transformer written directly in JAX."""
  m = config.model
  d, heads, length = m.d_model, m.num_heads, m.max_len
  keys = iter(jax.random.split(jax.random.key(0), 4 * m.num_layers + 2))
  normal = lambda shape, std: std * jax.random.normal(next(keys), shape)
  params = {"emb": normal((m.vocab_size, d), 0.02), "pos": normal((length, d), 0.02),
            "final": (jnp.ones(d), jnp.zeros(d)), "layers": [
                {"ln1": (jnp.ones(d), jnp.zeros(d)), "ln2": (jnp.ones(d), jnp.zeros(d)),
                 "qkv": normal((d, 3 * d), d**-0.5), "out": normal((d, d), d**-0.5),
                 "fc1": normal((d, m.d_ff), d**-0.5), "fc2": normal((m.d_ff, d), m.d_ff**-0.5)}
                for _ in range(m.num_layers)]}

  def layernorm(x, gain_bias):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gain_bias[0] + gain_bias[1]

  def loss_fn(p, tokens):
    b = tokens.shape[0]
    x = p["emb"][tokens] + p["pos"]
    causal = jnp.tril(jnp.ones((length, length), bool))
    for layer in p["layers"]:
      q, k, v = jnp.split(layernorm(x, layer["ln1"]) @ layer["qkv"], 3, axis=-1)
      q, k, v = (t.reshape(b, length, heads, -1) for t in (q, k, v))
      scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // heads)
      probs = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
      x = x + jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, length, d) @ layer["out"]
      x = x + jax.nn.gelu(layernorm(x, layer["ln2"]) @ layer["fc1"]) @ layer["fc2"]
    logits = layernorm(x, p["final"]) @ p["emb"].T
    return optax.softmax_cross_entropy_with_integer_labels(
        logits[:, :-1], tokens[:, 1:]).mean()

  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))

  def train_step(state, batch):
    p, opt_state = state
    loss, grads = jax.value_and_grad(loss_fn)(p, batch["tokens"])
    updates, opt_state = tx.update(grads, opt_state, p)
    return (optax.apply_updates(p, updates), opt_state), loss

  return timing.time_steps(jax.jit(train_step, donate_argnums=0), (params, tx.init(params)),
                           timing.token_batch(config), steps)


def throughput(argv=None):
  parser = argparse.ArgumentParser(prog="throughput.py throughput",
                                   description=_QUESTIONS["throughput"])
  parser.add_argument("--steps", type=int, default=20, help="timed steps after compilation")
  parser.add_argument("--sizes", default="S,M", help="comma-separated, from: S, M")
  parser.add_argument("--json", default="benchmarks/throughput.json", help="output file")
  parser.add_argument("--telemetry_every", type=int, default=10,
                      help="also time telemetry every N steps against none (0 = skip)")
  parser.add_argument("--placements", action=argparse.BooleanOptionalAction, default=True,
                      help="time every placement in float16 and float32 at the seed size")
  args = parser.parse_args(argv)
  sizes = args.sizes.split(",")
  unknown = [s for s in sizes if s not in benchmark_sizes.SIZES]
  if unknown or args.steps < 1:
    sys.exit(f"error: unknown size(s) {unknown} (allowed: S, M) or --steps < 1")

  results = {"device": str(jax.devices()[0]), "jax": jax.__version__, "rows": []}
  print(f"{'size':<5}{'step':<10}{'ms/step':>10}{'tokens/s':>12}{'GFLOP/step':>12}"
        f"{'matmul GFLOP/s':>16}{'MFU':>8}")
  for name in sizes:
    for variant in ("plain", "unrolled", "scanned"):
      config = benchmark_sizes.get_config(name)
      config.model.scan_layers = variant == "scanned"
      timer = plain_step_seconds if variant == "plain" else timing.step_seconds
      times = timer(config, args.steps)
      peak = timing.matmul_flops_per_second()  # next to each row: the machine is shared
      median = statistics.median(times)
      flops = timing.model_flops_per_step(config)
      tokens = config.train.batch_size * config.model.max_len
      row = {"size": name, "step": variant, "median_step_s": median,
             "tokens_per_s": tokens / median, "model_flops_per_step": flops,
             "matmul_flops_per_s": peak, "mfu": flops / median / peak, "steps": args.steps}
      results["rows"].append(row)
      print(f"{name:<5}{variant:<10}{median * 1e3:>10.1f}{row['tokens_per_s']:>12.0f}"
            f"{flops / 1e9:>12.2f}{peak / 1e9:>16.1f}{row['mfu']:>8.1%}", flush=True)
  if args.telemetry_every:
    print(f"\ntelemetry every {args.telemetry_every} steps (the default stack, scan_layers=None):")
    print(f"{'size':<5}{'off ms/step':>12}{'on ms/step':>12}{'overhead':>10}")
    results["telemetry"] = []
    for name in sizes:
      config = benchmark_sizes.get_config(name)
      off, on = telemetry_overhead(config, max(args.steps, 2 * args.telemetry_every),
                                   args.telemetry_every)
      results["telemetry"].append({"size": name, "every": args.telemetry_every,
                                   "off_step_s": off, "on_step_s": on, "overhead": on / off - 1})
      print(f"{name:<5}{off * 1e3:>12.1f}{on * 1e3:>12.1f}{on / off - 1:>10.1%}", flush=True)
  if args.placements:
    results["placements"] = placement_table(args.steps)
  with open(args.json, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=2)
  print(f"wrote {args.json}")


def placement_table(steps: int) -> list:
  """ms/step of the seed figure's recipe for every placement, float16 and float32, scanned
  and unrolled (engine, one run)."""
  print("\nseed-figure recipe (4 layers, width 64, encoder, conv positions, batch 16 x 64), "
        "ms/step:")
  print(f"{'placement':<13}{'f16 scanned':>13}{'f16 unrolled':>14}{'f32 scanned':>13}"
        f"{'f32 unrolled':>14}")
  rows = []
  for name in placements.names():
    row = {"placement": name}
    for dtype in ("float16", "float32"):
      for scan in (True, False):
        config = seed_figure.get_config()
        config.model.update(placement=name, dtype=dtype, scan_layers=scan)
        mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
        program = execution.ProgramSteps(config, mesh, num_runs=1)
        state, step = program.initial([config]), program.train
        batch = sharding.global_batch(mesh, timing.encoder_batch(config))
        row[f"{dtype}_{'scanned' if scan else 'unrolled'}_ms"] = 1e3 * statistics.median(
            timing.time_steps(step, state, batch, steps))
    rows.append(row)
    print(f"{name:<13}{row['float16_scanned_ms']:>13.1f}{row['float16_unrolled_ms']:>14.1f}"
          f"{row['float32_scanned_ms']:>13.1f}{row['float32_unrolled_ms']:>14.1f}", flush=True)
  return rows


# ---- profile --------------------------------------------------------------------------------

PROFILE_SIZES = ("seed", "S", "M")
DTYPES = ("float16", "bfloat16", "float32")
# Events of the runtime itself, not of an HLO operation.
_RUNTIME_EVENT = re.compile(r"::|\(|^\$|^Pjit|^Thunk|^end: ")


def _profile_config(size: str, dtype: str | None):
  config = seed_figure.get_config() if size == "seed" else benchmark_sizes.get_config(size)
  if dtype:
    config.model.dtype = dtype
  return config


def compiled_step(config):
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  program = execution.ProgramSteps(config, mesh, num_runs=1)
  state, step = program.initial([config]), program.train
  batch = sharding.global_batch(mesh, timing.run_batch(config))
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


def trace_step(size: str, dtype: str | None, steps: int) -> dict:
  config = _profile_config(size, dtype)
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
          "model_flops_per_s": timing.model_flops_per_step(config) / seconds,
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


def profile(argv=None):
  parser = argparse.ArgumentParser(prog="throughput.py profile", description=_QUESTIONS["profile"])
  parser.add_argument("--size", default="seed", help="one of: " + ", ".join(PROFILE_SIZES))
  parser.add_argument("--dtype", default=None,
                      help="one of: " + ", ".join(DTYPES) + " (default: the size's own)")
  parser.add_argument("--steps", type=int, default=10, help="traced steps")
  parser.add_argument("--top", type=int, default=15, help="single operations listed")
  parser.add_argument("--json", default=None, help="also write the figures to this file")
  args = parser.parse_args(argv)
  if args.size not in PROFILE_SIZES:
    sys.exit(f"error: --size={args.size} is not one of: {', '.join(PROFILE_SIZES)}")
  if args.dtype is not None and args.dtype not in DTYPES:
    sys.exit(f"error: --dtype={args.dtype} is not one of: {', '.join(DTYPES)}")
  if args.steps < 1 or args.top < 1:
    sys.exit(f"error: --steps={args.steps} and --top={args.top} must be at least 1")
  result = report(trace_step(args.size, args.dtype, args.steps), args.top)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)
    print(f"wrote {args.json}")


# ---- dispatch --------------------------------------------------------------------------------

def _dispatch_train(config: str, steps: int, per_dispatch: int, workdir: str,
                    cache: str) -> list:
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


def dispatch(argv=None):
  parser = argparse.ArgumentParser(prog="throughput.py dispatch",
                                   description=_QUESTIONS["dispatch"])
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
        records = _dispatch_train(args.config, args.steps, s, workdir, cache)
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


# ---- peers --------------------------------------------------------------------------------

PEER = os.path.join(os.path.dirname(ROOT), "shared", "peer")
WINDOWS, CLEAN_THRESHOLD = 2, 0.15


def _result_line(output: str) -> dict:
  lines = [l for l in output.splitlines() if l.startswith("RESULT ")]
  if not lines:
    raise RuntimeError(f"no RESULT line in:\n{output[-3000:]}")
  return json.loads(lines[-1][len("RESULT "):])


def _tokens_per_s(result: dict) -> float:
  return statistics.median(w["tokens_per_s"] for w in result["windows"])


def run_peer(name: str, python: str, size: str, steps: int, nanodo_root: str | None) -> float:
  script = {"torch": "bench_torch.py", "nanodo": "bench_nanodo.py"}[name]
  env = dict(os.environ)
  if name == "nanodo":
    env["NANODO_ROOT"] = nanodo_root
  done = subprocess.run([python, os.path.join(PEER, script), "--config", size,
                         "--steps", str(steps), "--windows", str(WINDOWS)],
                        cwd=PEER, env=env, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise RuntimeError(f"{script} --config {size} exited {done.returncode}:\n"
                       f"{done.stderr[-3000:]}")
  return _tokens_per_s(_result_line(done.stdout))


def run_normstudy(size: str, steps: int) -> dict:
  done = subprocess.run([sys.executable, os.path.abspath(__file__), "peers", "--_normstudy", size,
                         "--steps", str(steps)], cwd=ROOT, capture_output=True, text=True,
                        check=False)
  if done.returncode != 0:
    raise RuntimeError(f"normstudy at {size} exited {done.returncode}:\n{done.stderr[-3000:]}")
  return _result_line(done.stdout)


def time_normstudy(size: str, steps: int) -> dict:
  """The child process: normstudy's engine at `size`, in blocks and one step per dispatch."""
  sys.path.insert(0, PEER)
  import cpumon  # pylint: disable=import-outside-toplevel

  config = benchmark_sizes.get_config(size)
  engine, m = timing.EngineSteps(config), config.model
  length = engine.length
  tokens = config.train.batch_size * m.max_len
  result = {"size": size, "steps_per_dispatch": length}
  for name, fn, per_call in (("blocks", engine.block, length), ("one_step", engine.one_step, 1)):
    fn()  # compiles
    calls = max(2, -(-steps // per_call))
    windows = []
    for _ in range(WINDOWS):
      loop = cpumon.timed_loop(fn, calls, 10 * calls, CLEAN_THRESHOLD)
      seconds = (loop["median_clean_s"] or loop["median_all_s"]) / per_call
      windows.append({"tokens_per_s": tokens / seconds, "clean_calls": loop["n_clean"],
                      "calls": loop["n_total"]})
    result[name] = {"windows": windows}
  return result


def peers(argv=None):
  parser = argparse.ArgumentParser(prog="throughput.py peers", description=_QUESTIONS["peers"])
  parser.add_argument("--torch_python", default=None, help="a Python with torch (required)")
  parser.add_argument("--nanodo_root", default=None, help="nanodo's export (optional)")
  parser.add_argument("--sizes", default="S,M")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=25, help="clean steps per window")
  parser.add_argument("--json", default=None)
  parser.add_argument("--_normstudy", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args._normstudy:
    print("RESULT " + json.dumps(time_normstudy(args._normstudy, args.steps)), flush=True)
    return
  sizes = args.sizes.split(",")
  problems = [f"--sizes {s!r} (allowed: S, M)" for s in sizes if s not in ("S", "M")]
  if args.rounds < 1 or args.steps < 2:
    problems.append(f"--rounds {args.rounds} / --steps {args.steps} (at least 1 / 2)")
  if not args.torch_python or not os.access(args.torch_python, os.X_OK):
    problems.append(f"--torch_python {args.torch_python!r} (a Python with torch: "
                    "../shared/peer/README.md)")
  if args.nanodo_root and not os.path.isdir(args.nanodo_root):
    problems.append(f"--nanodo_root {args.nanodo_root!r} (a directory)")
  if problems:
    sys.exit("error: " + "; ".join(problems))
  contenders = ["torch", "normstudy"] + (["nanodo"] if args.nanodo_root else [])
  load_start = os.getloadavg()
  print(f"load at the start: {load_start[0]:.2f} (1 min), {load_start[1]:.2f} (5 min); "
        f"{os.cpu_count()} CPUs", flush=True)
  figures = {size: {c: [] for c in contenders + ["normstudy_one_step"]} for size in sizes}
  for round_index in range(args.rounds):
    order = contenders if round_index % 2 == 0 else contenders[::-1]
    for size in sizes:
      for contender in order:
        if contender == "normstudy":
          result = run_normstudy(size, args.steps)
          figures[size]["normstudy"].append(_tokens_per_s(result["blocks"]))
          figures[size]["normstudy_one_step"].append(_tokens_per_s(result["one_step"]))
          shown = (f"{figures[size]['normstudy'][-1]:.0f} tokens/s in blocks, "
                   f"{figures[size]['normstudy_one_step'][-1]:.0f} one step per dispatch")
        else:
          python = args.torch_python if contender == "torch" else sys.executable
          figures[size][contender].append(
              run_peer(contender, python, size, args.steps, args.nanodo_root))
          shown = f"{figures[size][contender][-1]:.0f} tokens/s"
        print(f"round {round_index + 1}/{args.rounds} {size} {contender}: {shown}", flush=True)
  load_end = os.getloadavg()
  print(f"\nload at the end: {load_end[0]:.2f} (1 min), {load_end[1]:.2f} (5 min)")
  print(f"\nmedian tokens/s over {args.rounds} round(s):")
  header = f"{'size':<6}" + "".join(f"{c:>20}" for c in figures[sizes[0]])
  print(header + f"{'normstudy/torch':>18}" + (f"{'normstudy/nanodo':>18}" if args.nanodo_root
                                               else ""))
  summary = {}
  for size in sizes:
    medians = {c: statistics.median(v) for c, v in figures[size].items()}
    ratios = {f"normstudy/{p}": medians["normstudy"] / medians[p]
              for p in ("torch", "nanodo") if p in medians}
    per_round = {f"normstudy/{p}": [a / b for a, b in zip(figures[size]["normstudy"],
                                                          figures[size][p])]
                 for p in ("torch", "nanodo") if p in medians}
    summary[size] = {"median_tokens_per_s": medians, "ratios": ratios,
                     "per_round_ratios": per_round,
                     "median_per_round_ratio": {k: statistics.median(v)
                                                for k, v in per_round.items()}}
    print(f"{size:<6}" + "".join(f"{medians[c]:>20.0f}" for c in figures[size])
          + "".join(f"{r:>17.2f}x" for r in ratios.values()))
  for size in sizes:
    for name, values in summary[size]["per_round_ratios"].items():
      print(f"{size} {name} per round: " + ", ".join(f"{v:.2f}x" for v in values)
            + f" (median {statistics.median(values):.2f}x)")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"rounds": figures, "summary": summary, "load_start": load_start,
                 "load_end": load_end, "steps_per_window": args.steps}, f, indent=2)
    print(f"wrote {args.json}")


COMMANDS = {"throughput": throughput, "profile": profile, "dispatch": dispatch, "peers": peers}


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  command = argv.pop(0) if argv and argv[0] in COMMANDS else "throughput"
  COMMANDS[command](argv)


if __name__ == "__main__":
  main()
