"""normstudy: which block design and which clipping keep a transformer run alive, and at what cost.

The commands are modules (`python -m normstudy.main`, `.study`, `.sweep`, `.run`, ...); the
layers are packages (core, data, engine, experiments, records, analysis: docs/development.md).
Importing the package does nothing else.
"""
