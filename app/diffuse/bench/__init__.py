"""Benchmarks behind `diffuse bench`: one module per measurement (forward, grid, prompts, AR baseline)."""
