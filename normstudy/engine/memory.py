"""A run's memory per device, estimated from its config and mesh before anything is compiled.

  plan(config, sizes, num_runs)   a MemoryPlan: bytes per device of the parameters, the
                                  optimizer state, the gradients, the activations the backward
                                  pass keeps (under config.model.remat) and the logits

Pure arithmetic (no jax): the entry commands refuse, in one line and before anything is written,
a run whose plan exceeds the memory it would run in (normstudy.experiments.preflight), so a
mistyped size is an error in a second rather than minutes of swapping.

The estimate counts what dominates a transformer step and no more: float32 parameters, Adam's two
float32 moments and float32 gradients, sharded over fsdp x tensor; per layer, the activations a
backward pass needs (under config.model.remat; the norms, residual sums and the MLP's activation
in float32 beside the compute-dtype copies the matmuls read; the attention probabilities in
float32 and in the compute dtype; with model.attention_kernel='cudnn' and no telemetry only a
float32 log-sum-exp per query, as the fused kernel keeps), over the batch's share of data x fsdp;
the logits in the compute dtype with their float32 gradient, and for a causal LM the shifted
copy its loss reads (core/loss.py: logits[:, :-1]); on a TPU, the compiler's own scratch
(TPU_WORKSPACE). `total` sums them, as a step holds them when its compiler has room to spare.

A compiler short of memory schedules apart what `total` adds up: with remat, the logits and one
layer's recomputation are never live together, and the shifted copy fuses away. `least` is that
schedule (the state, the layers' kept inputs, and the larger of the logits with their gradient
or one layer's recomputation): no compiled step of a GiB or more went below it (the seed
figure's 24 MiB step on v5e:2x2 does, its chip's on-core memory holding part of it), so an
accelerator's preflight refuses a run only when `least` exceeds the device (GiBs), and
`expected(device_bytes)` is `total` where it fits, `least` where it does not. Against a TPU
compiler's per-chip total (libtpu 0.0.42.1; docs/pods/*.csv, tests/test_compile.py holds each
within 25% of `expected`): the seed
figure's config on v5e:2x2 0.89 (remat none) and 1.11 (block), MERT's size on v5e:4x4 1.08
(none), 1.12 (dots) and 1.00 (block), a 125M LM on v5e:4x4 and v4:2x2x4 0.81 and 0.95, a 350M LM
on v5e:2x4 at batch 64 and 128 1.02 and 1.10; at batch 256 `total` (20.3 GiB) exceeds the chip's
15.75 GiB and the compiler fits the step in 13.1 GiB, 1.15 of `least` (its buffer assignment: the
float32 logits and one compute-dtype copy live at once, where batch 64 keeps four copies).
XLA:CPU's compiled step (arguments and temporaries) needs 1.0-1.8x `total`
(tests/test_memory.py), so on the host the preflight refuses by `total`. At the 4 x 256 configs
tests/test_compile.py compiles (tens of MiB of temporaries) the TPU compiler places most of a
step's working set in the chip's on-core memory, which its total does not count: 0.27-0.51 of
`total` there, far from any device's limit. `python -m normstudy.compile` gives the exact
figure for a topology.
"""

import dataclasses
import math

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 2**30

# Values per token a layer keeps for its backward pass, in units of d_model and d_ff, by remat
# policy (normstudy.core.model.REMAT_POLICIES), each as (float32 values, compute-dtype values):
# "none" keeps the inputs of every operation (norms, q/k/v/out, the MLP's two matmuls and its
# activation, the residual sums), the norms, residual sums and the MLP's activation in float32
# beside the compute-dtype copies the matmuls read; "dots" keeps the projections' and the MLP's
# matmul outputs; "block" keeps each block's input only. Read off the residuals a compiled
# float16 step at MERT's size stacks per layer (libtpu 0.0.42.1: six float32 and six float16
# [tokens, d_model], three float32 and one float16 [tokens, d_ff], the attention scores once in
# each; under "dots" five and one float16, under "block" one).
_KEPT_PER_TOKEN = {"none": ((6, 6), (3, 1)), "dots": ((0, 5), (0, 1)), "block": ((0, 1), (0, 0))}
# The attention scores a layer keeps without remat, per (row, head, query, key): the float32
# probabilities and their compute-dtype copy (the second matmul's input).
_SCORE_COPIES = (1, 1)
# A TPU compiler's own scratch per chip, beside the terms below: the seed figure's config
# (4 x 64) compiles for v5e:2x2 to 23.9-24.2 MiB per chip whatever its remat or dtype, about
# 16 MiB above its terms (libtpu 0.0.42.1). Negligible at MERT's size; it keeps a small
# config's plan from reading 2-4x low.
TPU_WORKSPACE = 16 * 2**20


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Bytes per device."""
  parameters: int
  optimizer: int
  gradients: int
  activations: int
  logits: int
  workspace: int = 0  # the compiler's own scratch (TPU_WORKSPACE on a TPU)
  least: int = 0  # the step scheduled as tightly as it goes (the module docstring)

  def expected(self, device_bytes: int | None) -> int:
    """What a compiler allocates on a device of `device_bytes`: `total` where it fits (or the
    device does not say), else `least` (the compiler schedules the step down to fit)."""
    if device_bytes is None or self.total <= device_bytes:
      return self.total
    return self.least

  @property
  def total(self) -> int:
    return (self.parameters + self.optimizer + self.gradients + self.activations
            + self.logits + self.workspace)

  def describe(self) -> str:
    """'31.4 GiB (parameters 7.8 GiB, optimizer 15.7 GiB, ...)', the terms of `total`."""
    parts = ", ".join(f"{name} {human(getattr(self, name))}" for name in (
        "parameters", "optimizer", "gradients", "activations", "logits")
        + (("workspace",) if self.workspace else ()))
    return f"{human(self.total)} ({parts})"

  def as_json(self) -> dict:
    return {**dataclasses.asdict(self), "total": self.total}


def human(n: float) -> str:
  """Bytes as '1.5 GiB', '320 MiB', '12 KiB'."""
  for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
    if abs(n) >= size:
      return f"{n / size:.3g} {unit}"
  return f"{int(n)} B"


def parameter_count(model) -> int:
  """The model's parameters, counted from `config.model` (the matrices exactly; norms, biases
  and the techniques' gains to within a few vectors of d_model per layer)."""
  d, ff, layers, vocab = model.d_model, model.d_ff, model.num_layers, model.vocab_size
  per_layer = 4 * d * d + 2 * d * ff + 8 * d  # attention, MLP, two norms' gains and biases
  if model.use_bias:
    per_layer += 4 * d + ff + d
  count = layers * per_layer + vocab * d + 2 * d  # the embedding and a final norm
  if not model.tie_embeddings:
    count += vocab * d
  if not model.causal:
    count += d  # the mask embedding
  if model.position_embedding == "learned":
    count += model.max_len * d
  elif model.position_embedding == "conv":
    count += model.conv_pos_width * (d // model.conv_pos_groups) * d + d
  return count


def train_flops(config) -> float:
  """Floating-point operations of one train step of `config` (every chip together), counted
  from the model: the matrix products only, 2 per multiply-add (Kaplan et al. 2020, "Scaling
  Laws for Neural Language Models", table 1; the attention term as in Hoffmann et al. 2022,
  appendix F).
    forward  = 2 T (L (4 d^2 + 2 d d_ff) + V d + conv)   the projections, the MLP, the logits
                                                          and a convolutional position mixer
             + 4 L T S d                                  q k^T and the weighted values
    step     = 3 x forward (the backward pass computes two products per forward one), plus one
               more forward of the blocks with model.remat=block (the recomputation)
  with T = batch x max_len tokens, S = max_len. Elementwise work (norms, softmax, GELU, the
  optimizer) is left out: a few percent at these widths. XLA's cost_analysis counts a while
  loop's body once, so a scanned layer stack reports about 1/L of this
  (tests/test_memory.py checks the count against cost_analysis on an unrolled program)."""
  m = config.model
  tokens = config.train.batch_size * m.max_len
  d, layers = m.d_model, m.num_layers
  conv = (m.conv_pos_width * (d // m.conv_pos_groups) * d
          if m.position_embedding == "conv" else 0)
  blocks = 2 * tokens * layers * (4 * d * d + 2 * d * m.d_ff) + 4 * layers * tokens * m.max_len * d
  if m.attention == "none":
    blocks = 2 * tokens * layers * 2 * d * m.d_ff
  forward = blocks + 2 * tokens * (m.vocab_size * d + conv)
  return float(3 * forward + (blocks if m.remat == "block" else 0))


def plan(config, sizes: dict, num_runs: int = 1, one_at_a_time: bool = False,
         platform: str = "cpu") -> MemoryPlan:
  """The memory plan of one device of a program of `num_runs` runs of `config` on a mesh of
  `sizes` ({"runs", "data", "fsdp", "tensor"}: normstudy.engine.sharding.mesh_shape). Every run's
  state is held; `one_at_a_time` (normstudy.engine.execution): only one run's step is live at
  once. `platform` "tpu" adds the TPU compiler's own scratch (TPU_WORKSPACE)."""
  model = config.model
  runs_here = math.ceil(num_runs / sizes["runs"])
  weights = parameter_count(model) * 4 * runs_here / (sizes["fsdp"] * sizes["tensor"])
  rows = math.ceil(config.train.batch_size / (sizes["data"] * sizes["fsdp"]))
  stepping = 1 if one_at_a_time else runs_here
  tokens = rows * model.max_len * stepping
  width = _DTYPE_BYTES[model.dtype]

  def kept_bytes(remat: str) -> float:
    """Bytes per layer the backward pass keeps of the projections, the MLP and the stream."""
    (f32_d, low_d), (f32_ff, low_ff) = _KEPT_PER_TOKEN[remat]
    return tokens * ((4 * f32_d + width * low_d) * model.d_model
                     + (4 * f32_ff + width * low_ff) * model.d_ff / sizes["tensor"])

  heads = model.num_heads / sizes["tensor"]
  # The fused kernel keeps only each row's float32 log-sum-exp; telemetry steps read the scores,
  # so a run with telemetry writes them out every telemetry_every steps (layers.Attention).
  if model.attention_kernel == "cudnn" and not config.train.telemetry_every:
    scores = rows * stepping * heads * model.max_len * 4
  else:
    f32_copies, low_copies = _SCORE_COPIES
    scores = rows * stepping * heads * model.max_len ** 2 * (4 * f32_copies + width * low_copies)
  stack = model.num_layers * (kept_bytes(model.remat) + (scores if model.remat == "none" else 0))
  # The one layer being recomputed holds all of its working set.
  recomputed = kept_bytes("none") + scores if model.remat != "none" else 0
  # The logits in the compute dtype and their float32 gradient (the softmax cross-entropy fuses
  # into it: no float32 copy of the logits outlives it); a causal LM's loss reads a shifted
  # copy in the compute dtype beside them (a compiled 350M LM keeps it unless short of memory).
  per_logit = width + 4
  logits = tokens * model.vocab_size * (per_logit + (width if model.causal else 0))
  gradients = weights * stepping / runs_here
  workspace = TPU_WORKSPACE if platform == "tpu" else 0
  state = int(weights) + int(2 * weights) + int(gradients) + workspace
  least = state + int(stack) + int(max(tokens * model.vocab_size * per_logit, recomputed))
  return MemoryPlan(parameters=int(weights), optimizer=int(2 * weights),
                    gradients=int(gradients), activations=int(stack + recomputed),
                    logits=int(logits), workspace=workspace,
                    least=least)
