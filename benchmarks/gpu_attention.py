"""What the attention core costs in a GPU step, and what a fused kernel would save: one layer's
causal self-attention, forward and backward, at the 125M LM's shape (benchmarks/gpu.py:
12 heads of 64, 1024 tokens, bfloat16), three ways:

  normstudy   what normstudy.core.layers.Attention computes between its projections
              (attention_scores, the causal mask, a float32 softmax, the weighted sum): the
              [rows, heads, 1024, 1024] scores materialised in HBM
  xla         jax.nn.dot_product_attention(implementation="xla")
  cudnn       jax.nn.dot_product_attention(implementation="cudnn"): cuDNN's fused (flash)
              attention, the scores never written out; what model.attention_kernel="cudnn"
              runs (layers.fused_attention)
Each row also gives the largest difference of its output from normstudy's on the same inputs.

The milliseconds are the median of 20 timed calls after one compiling call. gpu.py's step
recomputes each block once in the backward pass (model.remat="block"), so a step runs the
forward twice and the backward once per layer; `step_share` multiplies the per-layer times out
to the step's 12 layers that way and sets it against the step time gpu.py measured at the
largest --rows (--step_ms), when given.

  python benchmarks/gpu_attention.py [--rows 32,256] [--step_ms 949.6] [--json ...]
"""

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from normstudy.core import layers  # noqa: E402

HEADS, HEAD_DIM, LENGTH, LAYERS = 12, 64, 1024, 12


def normstudy_core(q, k, v):
  """Mirrors layers.Attention between its projections for a plain causal model: q, k, v
  [b, h, l, d] in the compute dtype."""
  logits, _ = layers.attention_scores(q, k)
  length = q.shape[2]
  logits = jnp.where(jnp.tril(jnp.ones((length, length), bool)), logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum("bhqk,bhkd->bhqd", probs.astype(q.dtype), v)


def fused_core(implementation):
  """layers.fused_attention (model.attention_kernel="cudnn") through jax's `implementation`."""
  return lambda q, k, v: layers.fused_attention(q, k, v, True, implementation)


def timed_ms(fn, *args, repeats: int = 20) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def inputs(rows: int):
  keys = jax.random.split(jax.random.key(0), 4)
  return tuple(jax.random.normal(key, (rows, HEADS, LENGTH, HEAD_DIM), jnp.bfloat16)
               for key in keys)


def measure(core, rows: int, reference) -> dict:
  q, k, v, cotangent = inputs(rows)
  forward = jax.jit(core)
  grads = jax.jit(jax.grad(lambda q, k, v: jnp.vdot(core(q, k, v), cotangent).real,
                           argnums=(0, 1, 2)))
  difference = jnp.max(jnp.abs(forward(q, k, v).astype(jnp.float32) - reference))
  return {"max_abs_difference": float(difference), "forward_ms": timed_ms(forward, q, k, v),
          "forward_backward_ms": timed_ms(grads, q, k, v)}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default="32,256")
  parser.add_argument("--step_ms", type=float, default=None,
                      help="gpu.py's 125M step time at the largest rows, for step_share")
  parser.add_argument("--json", default=os.path.join(ROOT, "docs", "gpu", "attention.json"))
  args = parser.parse_args(argv)
  device = jax.devices()[0]
  results = {"device": device.device_kind, "jax": jax.__version__, "rows": {}}
  cores = {"normstudy": normstudy_core, "xla": fused_core("xla"), "cudnn": fused_core("cudnn")}
  all_rows = [int(r) for r in args.rows.split(",")]
  for rows in all_rows:
    results["rows"][rows] = {}
    # Each way's output against normstudy's (bfloat16 outputs: differences of ~1e-2 are rounding).
    reference = jax.jit(normstudy_core)(*inputs(rows)[:3]).astype(jnp.float32)
    for name, core in cores.items():
      try:
        row = measure(core, rows, reference)
      except Exception as e:  # noqa: BLE001 (a kernel this device or jax cannot run: recorded)
        row = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
      else:
        # A step with block remat: the forward twice, the backward once, per layer.
        row["step_ms"] = LAYERS * (row["forward_ms"] + row["forward_backward_ms"])
        if args.step_ms and rows == max(all_rows):
          row["step_share"] = row["step_ms"] / args.step_ms
      results["rows"][rows][name] = row
      print(f"rows {rows}, {name}: " + ", ".join(
          f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
          for key, value in row.items()), flush=True)
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=2)
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
