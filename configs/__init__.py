"""normstudy's experiment configs, importable as a package so that one file builds on another
(`from configs import seed_figure`) the way a user's own config file builds on them.

Each file is also a `--config=configs/<file>.py[:<variant>]` for the entry commands: a
`get_config(variant)` over a table of variants (normstudy.core.config.variant_config) and, for a
study or sweep, the file's VARIANTS, STUDY_VARIANTS, SWEEP_VARIANTS, SWEEP and SWEEP_SETTINGS
(normstudy.experiments.grid).
"""
