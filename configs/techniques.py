"""Every stability technique against a Pre-LN baseline, ranked by the critical learning rate
(`make techniques`).

  python -m normstudy.sweep --config=configs/techniques.py --workdir=DIR/float16 \\
      --search=optimizer.learning_rate:0.1,1 --rounds=3 --probe_decades=0.125
  (the same with --config.model.dtype=float32 into DIR/float32; the arms at the recipe's rate
  into DIR/recipe; then python -m normstudy.techniques --workdir=DIR: techniques.csv)

The model is the seed figure's miniature (configs/seed_figure.py: a 4-layer, 64-wide encoder
trained by masked prediction on the Markov language, float16 with fairseq's loss scaler) with
Pre-LN, clip 1 and optax's AdamW (norm gains, biases and the techniques' scales not decayed);
each arm turns on one technique, as its placement, its norm, a model option, an optimizer
option or a loss term (docs/reference.md, "Stability techniques"), and is compared with its
baseline (BASELINES; every one here: `baseline`). The instrument is the survival study's
(configs/survival.py: a fixed warm-up then a constant rate, the fp16 loss scale starting at its
equilibrium, the failure rule of normstudy.records.outcomes, a logistic transition fitted to
every probe of the search) over a NUM_STEPS-step horizon with SEEDS seeds: what `make
techniques`'s hour on 2 cores affords for 19 arms in two dtypes (survival's horizon is 480).
The cost of a technique: its eval loss after 300 steps at the recipe's rate (3e-3, 2 seeds) and
its step time against the baseline's, from the same runs (the Makefile's `techniques` target).
"""

from configs import seed_figure
from configs import survival
from normstudy.core.experiment import Experiment
from normstudy.core.experiment import Part
from normstudy.core.experiment import Search
from normstudy.core.experiment import Techniques

# name: (label, {dotted.field: value}); labels name the technique from the config ("{auto}").
_ARMS = {
    "baseline": ("{auto}", {}),
    # Logits and attention
    "qk_norm": ("{auto}", {"model.qk_norm": "layernorm"}),
    "qk_clip": ("{auto}", {"model.qk_clip": 100.0}),  # Kimi K2's tau
    "softcap": ("{auto}", {"model.attn_softcap": 50.0, "model.output_softcap": 30.0}),  # Gemma 2
    "fp32_scores": ("{auto}", {"model.attention_scores_dtype": "float32"}),
    "z_loss": ("{auto}", {"loss.z_loss": 1e-4}),
    # Placements and norms
    "sub_ln": ("{auto}", {"model.placement": "sub_ln"}),
    "peri_ln": ("{auto}", {"model.placement": "peri_ln"}),
    "mix_ln": ("{auto}", {"model.placement": "mix_ln"}),
    "reordered_ln": ("{auto}", {"model.placement": "reordered_ln"}),  # OLMo 2
    "rezero": ("{auto}", {"model.placement": "rezero"}),
    "ngpt": ("{auto}", {"model.placement": "ngpt"}),  # nGPT's block, sphere and logit scale
    "dyt": ("{auto}", {"model.norm": "dyt"}),  # alpha 0.5
    "layernorm_scaling": ("{auto}", {"model.layernorm_scaling": True}),
    "layer_scale": ("{auto}", {"model.layer_scale": 0.1}),  # CaiT: 0.1 for shallow stacks
    "emb_grad_shrink": ("{auto}", {"model.emb_grad_shrink": 0.1}),  # GLM-130B's alpha
    # The optimizer
    "adam_atan2": ("{auto}", {"optimizer.name": "adam_atan2"}),
    "adam_eps_1e-8": ("{auto} | eps={optimizer.eps}", {"optimizer.eps": 1e-8}),  # optax's and PyTorch's default
    "update_clip": ("{auto}", {"optimizer.update_clip": 1.0}),  # Adafactor's d
    "skip_spikes": ("{auto}", {"optimizer.skip_spikes": 6.0}),  # OLMo-core's 6 sigma
}
# Each technique's own baseline (the arm it differs from in one thing).
BASELINES = {name: "baseline" for name in _ARMS if name != "baseline"}
# Evaluated as users asked (issue 43): on runs at the same rate and seed, do they change the
# time to failure, the number of loss spikes, the loss after recovery? (spike_handling.csv)
SPIKE_HANDLING = ("skip_spikes", "update_clip")

NUM_STEPS = 120
SEEDS = [0, 1, 2]
# The critical learning rate by search in each dtype (3 rounds from [0.1, 1], then a probe round
# 1/8 decade either side), then each arm at the recipe's rate for its cost (2 seeds, 300 steps;
# two runs a program, each program on its own core, so step times compare); then
# `python -m normstudy.techniques --workdir=DIR` writes techniques.csv from the three.
SEARCH = Search("optimizer.learning_rate", 0.1, 1.0, rounds=3, probe_decades=0.125)
RECIPE_STEPS = 300


def base_config():
  """The seed recipe with optax's Adam with decoupled decay and the model's decay mask, so the
  gains and scales the techniques add are not decayed (fairseq's Adam, the seed recipe's,
  decays every parameter)."""
  config = seed_figure.base_config()
  config.optimizer.name = "adamw"
  return config


EXPERIMENT = Experiment(base=base_config,
    arms=_ARMS, axes={}, settings=survival.settings_at(NUM_STEPS),
    parts={**{dtype: Part(axes={"train.seed": SEEDS}, settings={"model.dtype": dtype},
                          search=SEARCH) for dtype in ("float16", "float32")},
           "recipe": Part(axes={"train.seed": [0, 1],
                                "optimizer.learning_rate": [survival.LEARNING_RATE]},
                          settings={"train.num_steps": RECIPE_STEPS,
                                    "train.eval_every": RECIPE_STEPS,
                                    "train.checkpoint_every": RECIPE_STEPS},
                          max_runs_per_program=2)},
    techniques=Techniques(baselines=BASELINES, spike_handling=SPIKE_HANDLING))

get_config = EXPERIMENT.get_config
