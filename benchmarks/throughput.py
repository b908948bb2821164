"""Training-step throughput and model FLOP utilisation (MFU) at two fixed sizes, and every
placement in float16 and float32 at the seed figure's size.

  python benchmarks/throughput.py [--steps 20] [--sizes S,M] [--json out.json]
                                 [--telemetry_every 10] [--placements] [--no-sizes]

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
"""

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from normstudy.core import config as config_lib
from normstudy.core import placements
from normstudy.engine import execution
from normstudy.engine import sharding

SIZES = {
    # d_model, heads, layers, d_ff, length, vocab, batch
    "S": (128, 4, 4, 512, 128, 256, 16),
    "M": (256, 4, 6, 1024, 256, 4096, 16),
}


def size_config(name: str):
  d, heads, layers, ff, length, vocab, batch = SIZES[name]
  config = config_lib.default_config()
  config.model.update(d_model=d, num_heads=heads, num_layers=layers, d_ff=ff, max_len=length,
                      vocab_size=vocab, causal=True, dtype="float32", activation="gelu_tanh",
                      use_bias=False, position_embedding="learned")
  config.optimizer.update(name="adam", weight_decay=0.0, clip_norm=1.0, warmup_steps=0,
                          schedule="constant")
  config.train.update(batch_size=batch, num_steps=1000)
  return config


def model_flops_per_step(config) -> float:
  m, b = config.model, config.train.batch_size
  per_token_layer = 2 * (4 * m.d_model * m.d_model + 2 * m.d_model * m.d_ff
                         + 2 * m.max_len * m.d_model)
  per_token = m.num_layers * per_token_layer + 2 * m.d_model * m.vocab_size
  return 3.0 * per_token * m.max_len * b


def matmul_flops_per_second(n: int = 2048, repeats: int = 10) -> float:
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  matmul = jax.jit(lambda x, y: x @ y)
  matmul(a, a).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, a).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * n**3 / statistics.median(times)


def _time(train_step, state, batch, steps: int) -> list[float]:
  state, metrics = train_step(state, batch)  # compile
  jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = train_step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  return times


def _batch(config):
  m = config.model
  rng = np.random.default_rng(0)
  return {"tokens": jnp.asarray(
      rng.integers(0, m.vocab_size, (config.train.batch_size, m.max_len)), jnp.int32)}


def step_seconds(config, steps: int, runs=None) -> list[float]:
  """Seconds per train step of normstudy's engine, after compilation: by default one run (what
  normstudy.main runs: the vmapped step over a run axis of size 1, sharded on a one-device
  mesh); with `runs`, a list of K configs, the K runs as one program, as a sweep steps them
  (normstudy.engine.execution chooses how for the device). Decoders get tokens, encoders tokens
  and a mask: one random batch, the same for every run, placed on the device once."""
  runs = runs or [config]
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  steps_ = execution.ProgramSteps(config, mesh, num_runs=len(runs))
  state, train_step = steps_.initial(runs), steps_.train
  local = (jax.tree.map(lambda x: np.asarray(x)[None], _batch(config)) if config.model.causal
           else _encoder_batch(config))
  local = jax.tree.map(lambda x: np.concatenate([x] * len(runs)), local)
  batch = sharding.global_batch(mesh, local)
  return _time(train_step, state, batch, steps)


def telemetry_overhead(config, steps: int, every: int) -> tuple[float, float]:
  """(seconds per step without telemetry, with telemetry every `every` steps), each the mean
  over the same number of steps, so the occasional telemetry step is counted at its weight: the
  loop's two compiled steps (normstudy.engine.execution) on one device."""
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  program = execution.ProgramSteps(config, mesh, num_runs=1)
  plain_step, telemetry_step = program.train, program.telemetry
  batch = sharding.global_batch(mesh, jax.tree.map(lambda x: np.asarray(x)[None],
                                                  _batch(config)))
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

  return _time(jax.jit(train_step, donate_argnums=0), (params, tx.init(params)),
               _batch(config), steps)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20, help="timed steps after compilation")
  parser.add_argument("--sizes", default="S,M", help="comma-separated, from: S, M")
  parser.add_argument("--json", default="benchmarks/throughput.json", help="output file")
  parser.add_argument("--telemetry_every", type=int, default=10,
                      help="also time telemetry every N steps against none (0 = skip)")
  parser.add_argument("--placements", action=argparse.BooleanOptionalAction, default=True,
                      help="time every placement in float16 and float32 at the seed size")
  args = parser.parse_args(argv)
  sizes = args.sizes.split(",")
  unknown = [s for s in sizes if s not in SIZES]
  if unknown or args.steps < 1:
    sys.exit(f"error: unknown size(s) {unknown} (allowed: S, M) or --steps < 1")

  results = {"device": str(jax.devices()[0]), "jax": jax.__version__, "rows": []}
  print(f"{'size':<5}{'step':<10}{'ms/step':>10}{'tokens/s':>12}{'GFLOP/step':>12}"
        f"{'matmul GFLOP/s':>16}{'MFU':>8}")
  for name in sizes:
    for variant in ("plain", "unrolled", "scanned"):
      config = size_config(name)
      config.model.scan_layers = variant == "scanned"
      timer = plain_step_seconds if variant == "plain" else step_seconds
      times = timer(config, args.steps)
      peak = matmul_flops_per_second()  # measured next to each row: the machine is shared
      median = statistics.median(times)
      flops = model_flops_per_step(config)
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
      config = size_config(name)
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


def seed_config(variant="pre_norm_clip1"):
  from configs import seed_figure
  return seed_figure.get_config(variant)


def _encoder_batch(config):
  m, rng = config.model, np.random.default_rng(0)
  return {"tokens": np.asarray(rng.integers(0, m.vocab_size, (1, config.train.batch_size,
                                                              m.max_len)), np.int32),
          "mask": rng.random((1, config.train.batch_size, m.max_len)) < config.data.mask_prob}


class EngineSteps:
  """normstudy's engine stepping one run on one device as normstudy.main does: `block()` runs
  train.steps_per_dispatch steps in one compiled loop, `one_step()` one step per dispatch (how an
  evaluation, a telemetry step or the locate pass runs); each waits for its metrics. The batches
  cycle through a pool of 4 random ones (encoders' with their masks). The benchmarks that time
  the engine by blocks share it (benchmarks/peers.py)."""

  def __init__(self, config, pool_size: int = 4):
    m = config.model
    self.length = config.train.steps_per_dispatch
    self.mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    self.program = execution.ProgramSteps(config, self.mesh, num_runs=1)
    rng, shape = np.random.default_rng(0), (1, config.train.batch_size, m.max_len)
    self.pool = []
    for _ in range(pool_size):
      batch = {"tokens": rng.integers(0, m.vocab_size, shape, dtype=np.int32)}
      if not m.causal:
        batch["mask"] = rng.random(shape) < config.data.mask_prob
      self.pool.append(batch)
    self.state = self.program.initial([config])
    self.index = 0

  def block(self):
    batches = [self.pool[(self.index + j) % len(self.pool)] for j in range(self.length)]
    self.state, metrics = self.program.step_block(self.state,
                                                  self.program.block_work(batches, self.length))
    jax.device_get(metrics)
    self.index += self.length

  def one_step(self):
    batch = sharding.global_batch(self.mesh, self.pool[self.index % len(self.pool)])
    self.state, metrics = self.program.step(self.state, batch)
    jax.device_get(metrics)
    self.index += 1

  def params(self):
    state = self.state[0] if isinstance(self.state, list) else self.state
    return jax.device_get(state.params)


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
        config = seed_config()
        config.model.update(placement=name, dtype=dtype, scan_layers=scan)
        mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
        program = execution.ProgramSteps(config, mesh, num_runs=1)
        state, step = program.initial([config]), program.train
        batch = sharding.global_batch(mesh, _encoder_batch(config))
        row[f"{dtype}_{'scanned' if scan else 'unrolled'}_ms"] = 1e3 * statistics.median(
            _time(step, state, batch, steps))
    rows.append(row)
    print(f"{name:<13}{row['float16_scanned_ms']:>13.1f}{row['float16_unrolled_ms']:>14.1f}"
          f"{row['float32_scanned_ms']:>13.1f}{row['float32_unrolled_ms']:>14.1f}", flush=True)
  return rows


if __name__ == "__main__":
  main()
