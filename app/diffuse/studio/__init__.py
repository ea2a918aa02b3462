"""Diffuse Studio: a desktop app (PySide6 + pyqtgraph) that shows a diffusion LM denoise.

Start it with `diffuse-studio` or `python -m diffuse.studio`. Modules: main_window (layout and
flows), workers (engine and job threads), run_state (per-step arrays the views read), canvas,
heatmap, cache_view, throughput (the views), chat and conversations, model_panel,
settings_panel, compare, export, theme and storage.
"""
