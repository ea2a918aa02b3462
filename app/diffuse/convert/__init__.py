"""Hugging Face checkpoints (LLaDA, Dream) -> GGUF in our dialect: llama.cpp's names and keys plus
the original tokenizer.json and chat template (see docs/ARCHITECTURE.md)."""
from diffuse.convert.hf_to_gguf import FORMAT_VERSION, OUTTYPES, convert_hf

__all__ = ["FORMAT_VERSION", "OUTTYPES", "convert_hf"]
