"""Throughput on one GPU: a 125M-parameter causal LM in bfloat16 (tokens/s, MFU), the seed
figure's arms at the paper's size in float16, and a K-run vmapped sweep against K runs one after
another at the seed figure's size. Run by benchmarks/gpu.sh; see there.

  python benchmarks/gpu.py [--steps 20] [--ks 8,64] [--json docs/gpu/results.json]
                          [--sections matmul,gpt_125m_bf16,...]
  python benchmarks/gpu.py attention [--rows 32,256] [--step_ms 949.6] [--json ...]

MFU = model FLOPs per step (normstudy.engine.timing's count: every matmul of the forward pass,
3x for forward and backward) / step time / the GPU's dense peak for the dtype (PEAK_TFLOPS, by
the device's name; a bf16 matmul's measured rate is printed beside it).
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs import benchmark as benchmark_sizes  # noqa: E402
from configs import seed_figure  # noqa: E402
from normstudy.core import layers  # noqa: E402
from normstudy.engine import timing  # noqa: E402

# Dense bfloat16/float16 tensor-core peak, TFLOP/s (vendor data sheets), by the model token of
# jax's device_kind ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA L40S") and, where the
# form factor changes the peak, a second token. Whole tokens only: "L4" is not "L40S", an H100
# PCIe card is not an SXM one. A GPU not listed gets no MFU rather than a wrong one.
PEAK_TFLOPS = (
    ("H200", None, 989.0), ("H100", "PCIe", 756.0), ("H100", "NVL", 835.0), ("H100", None, 989.0),
    ("A100", None, 312.0), ("L40S", None, 362.0), ("L4", None, 121.0), ("A10", None, 125.0),
)
SEED_ARMS = ("pre_norm_clip10", "pre_norm_clip1", "post_norm_deepnorm_clip1",
             "pre_norm_attn_relax_clip1")


def peak_tflops(device_kind: str) -> float | None:
  """The dense bf16 peak of a device_kind, TFLOP/s, or None for a GPU not in PEAK_TFLOPS."""
  import re
  tokens = [t.upper() for t in re.split(r"[\s_-]+", device_kind) if t]
  for model, variant, tflops in PEAK_TFLOPS:
    if model.upper() in tokens and (variant is None or variant.upper() in tokens):
      return tflops
  return None


def peak_flops(device) -> float | None:
  tflops = peak_tflops(device.device_kind)
  return None if tflops is None else tflops * 1e12


# Rows of 1024 tokens a step for the 125M LM: 256 x 1024 = 262K tokens fills an H100/H200 (16
# rows, 16K tokens, left most of it idle); halved until it fits on a smaller GPU.
GPT_ROWS = 256


def gpt_125m(rows: int = GPT_ROWS, remat: str = "block", attention_kernel: str = "xla"):
  """GPT-2 small's shape (12 layers, width 768, 12 heads, 1024 tokens, vocab 50304), bf16, each
  block recomputed in the backward pass by default (its activations at 256 rows would not fit);
  `remat` is model.remat ("block", "dots": matmul outputs kept, "none"), `attention_kernel`
  model.attention_kernel ("xla": the scores written out; "cudnn": the fused kernel)."""
  config = benchmark_sizes.get_config("S")
  config.model.update(d_model=768, num_heads=12, num_layers=12, d_ff=3072, max_len=1024,
                      vocab_size=50304, dtype="bfloat16", tie_embeddings=True, remat=remat,
                      attention_kernel=attention_kernel)
  config.train.batch_size = rows
  return config


def timed_fitting(make_config, rows: int, steps: int) -> dict:
  """timed() at `rows` rows, halved while the GPU runs out of memory; the rows used recorded."""
  while True:
    try:
      row = timed(make_config(rows), steps)
    except Exception as e:  # noqa: BLE001 (XLA's out-of-memory error; others re-raise)
      if rows > 1 and ("RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()):
        print(f"{rows} rows do not fit: trying {rows // 2}", flush=True)
        rows //= 2
        continue
      raise
    return {**row, "rows": rows, "tokens_per_step": rows * make_config(rows).model.max_len}


def paper_size(arm: str):
  """A seed figure arm at the paper's size: 24 layers, width 1024, 16 heads, float16."""
  config = seed_figure.get_config(arm)
  config.model.update(num_layers=24, d_model=1024, num_heads=16, d_ff=4096, max_len=512)
  config.train.batch_size = 16
  return config


def timed(config, steps: int) -> dict:
  seconds = statistics.median(timing.step_seconds(config, steps))
  tokens = config.train.batch_size * config.model.max_len
  return {"ms_per_step": 1e3 * seconds, "tokens_per_s": tokens / seconds,
          "model_flops_per_s": timing.model_flops_per_step(config) / seconds}


SECTIONS = ("matmul", "gpt_125m_bf16", "gpt_125m_bf16_cudnn", "sweep", "paper_size_fp16",
            "gpt_125m_bf16_variants")


def _versions() -> dict:
  """The versions of the packages that shape the numbers (the GPU's image brings its own)."""
  from importlib import metadata
  names = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")
  versions = {}
  for name in names:
    try:
      versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      versions[name] = None
  return versions


def throughput(argv=None):
  parser = argparse.ArgumentParser(prog="gpu.py", description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--ks", default="8,64", help="sweep sizes K (even)")
  parser.add_argument("--json", default=os.path.join(ROOT, "docs", "gpu", "results.json"))
  parser.add_argument("--sections", default=",".join(SECTIONS),
                      help=f"which parts to run, in this order: {','.join(SECTIONS)}")
  args = parser.parse_args(argv)
  sections = args.sections.split(",")
  unknown = sorted(set(sections) - set(SECTIONS))
  if unknown:
    parser.error(f"--sections {','.join(unknown)}: unknown; allowed: {','.join(SECTIONS)}")
  device = jax.devices()[0]
  if device.platform != "gpu":
    sys.exit(f"error: no GPU here (JAX's first device is {device}); this benchmark needs one")
  peak = peak_flops(device)
  results = {"device": device.device_kind, "jax": jax.__version__, "versions": _versions(),
             "sections": sections,
             "steps": args.steps, "peak_flops": peak, "complete": False, "errors": {},
             "section_seconds": {}}
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)

  def write():
    # After every section, so a run cut short (a lease's limit) keeps what it measured.
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)

  def section(name, measure):
    """Runs one part; a failure is recorded with its traceback and the next part still runs."""
    start = time.perf_counter()
    try:
      measure()
    except Exception:  # noqa: BLE001 (recorded in the JSON and printed; the run goes on)
      import traceback
      results["errors"][name] = traceback.format_exc()
      print(f"{name} failed:\n{results['errors'][name]}", flush=True)
    results["section_seconds"][name] = time.perf_counter() - start
    print(f"[{name}: {results['section_seconds'][name]:.0f} s]", flush=True)
    write()

  def matmul():
    results["bf16_matmul_flops_per_s"] = rate = timing.matmul_flops_per_second(
        8192, repeats=20, dtype=jnp.bfloat16)
    print(f"{device.device_kind}: peak {peak and peak / 1e12} TFLOP/s, "
          f"bf16 8192^3 matmul {rate / 1e12:.0f} TFLOP/s", flush=True)

  def lm_row(what: str, rows: int, **options) -> dict:
    """The 125M LM with gpt_125m's `options`, from `rows` rows (halved until it fits)."""
    row = timed_fitting(functools.partial(gpt_125m, **options), rows, args.steps)
    row.update(options, mfu=row["model_flops_per_s"] / peak if peak else None)
    print(f"125M causal LM, bf16{what}, {row['tokens_per_step']} tokens a step: "
          f"{row['tokens_per_s']:.0f} tokens/s" + (f", MFU {row['mfu']:.1%}" if peak else ""),
          flush=True)
    return row

  def lm():
    results["gpt_125m_bf16"] = lm_row("", GPT_ROWS)

  def lm_cudnn():
    # The default LM with attention through the fused kernel (model.attention_kernel="cudnn").
    results["gpt_125m_bf16_cudnn"] = lm_row(", cudnn attention", GPT_ROWS,
                                            attention_kernel="cudnn")

  def lm_variants():
    # What the block recomputation costs: the matmul outputs kept ("dots"), or nothing
    # recomputed ("none") at fewer rows; each starts at the rows given and halves until it fits.
    results["gpt_125m_bf16_variants"] = []
    for remat, rows in (("dots", GPT_ROWS // 2), ("none", GPT_ROWS // 4)):
      results["gpt_125m_bf16_variants"].append(lm_row(f", remat {remat}", rows, remat=remat))
      write()

  def sweeps():
    # The engine's step of K runs as one program (vmapped on a GPU) against the one-run step,
    # each on one random batch staged once: what a sweep's runs cost on the device, not its data.
    results["sweep"] = []
    seed = seed_figure.get_config("pre_norm_clip1")
    alone = statistics.median(timing.step_seconds(seed, args.steps))
    for k in (int(k) for k in args.ks.split(",")):
      configs = timing.grid_runs(seed, k)
      stacked = statistics.median(timing.step_seconds(configs[0], args.steps, runs=configs))
      row = {"runs": k, "vmapped_run_steps_per_s": k / stacked,
             "sequential_run_steps_per_s": 1 / alone,
             "vmapped_ms_per_step": 1e3 * stacked, "alone_ms_per_step": 1e3 * alone}
      row["ratio"] = row["vmapped_run_steps_per_s"] / row["sequential_run_steps_per_s"]
      results["sweep"].append(row)
      write()
      print(f"K = {k}: vmapped {row['vmapped_run_steps_per_s']:.0f} run-steps/s, sequential "
            f"{row['sequential_run_steps_per_s']:.0f}: {row['ratio']:.1f}x", flush=True)

  def arms():
    results["paper_size_fp16"] = {}
    for arm in SEED_ARMS:
      row = timed(paper_size(arm), args.steps)
      row["mfu"] = row["model_flops_per_s"] / peak if peak else None
      results["paper_size_fp16"][arm] = row
      write()
      print(f"{arm} (24 x 1024, fp16): {row['tokens_per_s']:.0f} tokens/s, "
            f"{row['ms_per_step']:.1f} ms/step", flush=True)

  measures = {"matmul": matmul, "gpt_125m_bf16": lm, "gpt_125m_bf16_cudnn": lm_cudnn,
              "sweep": sweeps, "paper_size_fp16": arms, "gpt_125m_bf16_variants": lm_variants}
  for name in sections:
    section(name, measures[name])
  results["complete"] = not results["errors"]
  write()
  print(f"wrote {args.json}" + ("" if results["complete"] else
                                f" (failed: {', '.join(results['errors'])})"))
  return 0 if results["complete"] else 1



# ---- attention --------------------------------------------------------------------------------

ATTENTION_DOC = """What the attention core costs in a GPU step, and what a fused kernel saves:
one layer's causal self-attention, forward and backward, at the 125M LM's shape (the
`throughput` part above: 12 heads of 64, 1024 tokens, bfloat16), three ways:

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

  python benchmarks/gpu.py attention [--rows 32,256] [--step_ms 949.6] [--json ...]
"""

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


def attention(argv=None):
  parser = argparse.ArgumentParser(prog="gpu.py attention",
                                   description=ATTENTION_DOC.splitlines()[0])
  parser.add_argument("--rows", default="32,256")
  parser.add_argument("--step_ms", type=float, default=None,
                      help="the 125M step time at the largest rows (gpu.py's), for step_share")
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


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] == "attention":
    attention(argv[1:])
    return 0
  return throughput(argv[1:] if argv and argv[0] == "throughput" else argv)


if __name__ == "__main__":
  sys.exit(main())
