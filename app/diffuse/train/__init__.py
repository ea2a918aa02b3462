"""Train a small LLaDA-architecture masked diffusion LM on CPU (needs the `train` extra: PyTorch).

`python -m diffuse.train.corpus DIR` prepares the demo corpus; `diffuse train DIR --out RUN`
trains, writes RUN/hf (Hugging Face layout) and, with --gguf, converts it with our converter.
"""
