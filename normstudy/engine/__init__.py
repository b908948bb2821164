"""The engine: a program's devices and how it trains on them (platform, sharding, execution, the
train loop, the recorder and its writers, checkpoints, ahead-of-time compilation). Imports the
data, the core, the records and the errors."""
