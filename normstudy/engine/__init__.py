"""The engine: a program's devices and how it trains on them (platform, sharding, execution, the
train loop, the recorder and its writers, checkpoints, ahead-of-time compilation and the memory
plan it is checked against). Imports the
data, the core, the records and the errors."""
