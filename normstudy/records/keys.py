"""The keys of metrics.jsonl's records, defined once: what the loop writes and the analysis reads.

Every logged step: STEP_KEYS (after `step`), and TOKENS_PER_SEC. On some steps: EVAL_LOSS (eval
steps), UPDATE_SIZE and ACCUMULATED_UPDATE (the first train.update_size_steps steps), NONFINITE_AT (a step that went
non-finite: where), and an auxiliary loss term's value under its own key (`z_loss`). On
telemetry steps: per-layer metrics as `<name>/layer_<i>` (`layer_key`), per-head ones as
`<name>/layer_<i>/head_<j>` (`head_key`), GLOBAL_METRICS, and
FP16_OVERFLOWS for float16 runs.
"""

import re

STEP = "step"
LOSS = "loss"  # cross entropy on the predicted tokens (auxiliary terms apart)
GRAD_NORM = "grad_norm"  # global L2 norm of the unscaled gradient, before clipping
CLIPPED = "clipped"  # grad_norm > clip_norm
LR = "lr"
LOSS_SCALE = "loss_scale"  # the scale this step's loss was multiplied by (1 without fp16)
SKIPPED = "skipped"  # the update was skipped for a non-finite gradient
SKIPPED_TOTAL = "skipped_total"
# The train step's metrics recorded on every logged step, in the order records hold them.
STEP_KEYS = (LOSS, GRAD_NORM, CLIPPED, LR, LOSS_SCALE, SKIPPED, SKIPPED_TOTAL)
# The step's metrics that steer the loop and are not recorded as such: whether the run stepped,
# its life (normstudy.core.life's codes), a telemetry step's tree, and a block's failure sites.
ACTIVE = "active"
STATUS = "status"
TELEMETRY = "telemetry"
SITES = "sites"
CONTROL_KEYS = (ACTIVE, STATUS, TELEMETRY, SITES)

# The global L2 norm of the step's update (what the optimizer computed, the learning rate
# included; applied only when the step is finite): its spikes can come before loss spikes.
UPDATE_NORM = "update_norm"
EVAL_LOSS = "eval_loss"
UPDATE_SIZE = "update_size"  # DeepNet's ||f(x; theta_t+1) - f(x; theta_t)|| (core.steps)
# DeepNet's accumulated update ||f(x; theta_t) - f(x; theta_0)||, beside UPDATE_SIZE
ACCUMULATED_UPDATE = "accumulated_update"
TOKENS_PER_SEC = "tokens_per_sec"
NONFINITE_AT = "nonfinite_at"
FP16_OVERFLOWS = "fp16_overflows"
Z_LOSS = "z_loss"
# Updates skipped as loss or gradient-norm spikes so far (optimizer.skip_spikes > 0).
SPIKE_SKIPS = "spike_skips"
# Heads whose W_q and W_k the step rescaled (model.qk_clip > 0).
QK_CLIPPED_HEADS = "qk_clipped_heads"

# Per-layer telemetry sown by the model, one value per layer.
SOWN_LAYER_METRICS = (
    "attn_logit_max",  # largest pre-softmax attention score as the softmax sees it
    "attn_entropy",  # mean entropy (nats) of the attention rows
    "act_rms",  # RMS of the residual stream after the block
    "resid_absmax",  # max |x| of the residual stream after the block
    "mlp_preact_absmax",  # max |input of the MLP activation|
    # RMS of the input of each sublayer's norm (the placement's "in" norm: Post-LN's
    # alpha x + F(x), Pre-LN's residual stream), at its first use in the layer (a scanned Mix-LN
    # stack computes both uses: its Pre-LN one); NaN for a placement without norms (ReZero)
    "attn_norm_input_rms",
    "mlp_norm_input_rms",
)
# Per-layer telemetry computed by the step from gradients, updates and parameters.
STEP_LAYER_METRICS = ("grad_norm", "update_norm", "param_norm")
LAYER_METRICS = SOWN_LAYER_METRICS + STEP_LAYER_METRICS
GLOBAL_METRICS = ("output_logit_max", "log_z_mean")
# Per-head telemetry: record name -> the sown statistic ([num_heads] per layer), recorded as
# `<name>/layer_<i>/head_<j>` (head_key): the largest attention logit of each head.
HEAD_METRICS = {"attn_logit_max": "attn_logit_max_per_head"}


def head_key(name: str, layer: int, head: int) -> str:
  """'attn_logit_max/layer_3/head_1'."""
  return f"{name}/layer_{layer}/head_{head}"


def layer_key(name: str, layer: int) -> str:
  """'attn_logit_max/layer_3'."""
  return f"{name}/layer_{layer}"


_LAYER_KEY = re.compile(r"^(?P<name>[a-z_]+)/layer_(?P<layer>\d+)$")
_HEAD_KEY = re.compile(r"^(?P<name>[a-z_]+)/layer_(?P<layer>\d+)/head_(?P<head>\d+)$")


def parse_head_key(key: str):
  """(name, layer, head) for a `<name>/layer_<i>/head_<j>` record key (head_key), else None."""
  match = _HEAD_KEY.match(key)
  return (match["name"], int(match["layer"]), int(match["head"])) if match else None


def parse_layer_key(key: str):
  """(name, layer) for a `<name>/layer_<i>` record key, else None."""
  match = _LAYER_KEY.match(key)
  return (match["name"], int(match["layer"])) if match else None
