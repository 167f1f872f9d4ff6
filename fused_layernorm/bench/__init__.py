"""Benchmark of fused_layernorm against its peers: ``python -m fused_layernorm.bench``.

Modules: cases (shapes, inputs, bytes), timing (CUDA events with L2 flush,
host timers, copy bandwidth), peers (the implementations compared), verify
(float32 reference and tolerances), runner (the loops), report (table,
summary, CSV, JSON, PNG, environment).
"""
