"""The pure core: functions of configs and arrays (config schema, registries, placements, layers,
model, loss, optimizer, precision, parametrizations, techniques, steps). No files, no devices, no
flags; imports only normstudy.errors and normstudy.records' schema."""
