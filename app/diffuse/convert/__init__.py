"""Hugging Face checkpoints -> GGUF in our dialect: llama.cpp's names and keys plus the original
tokenizer.json and chat template (see docs/ARCHITECTURE.md)."""
from diffuse.convert import diffusion_gemma
from diffuse.convert.families import FAMILIES
from diffuse.convert.hf_to_gguf import FORMAT_VERSION, OUTTYPES, convert_hf

# The architectures the converter takes, for messages and help texts: its family table's, and
# DiffusionGemma's (its own converter).
TAKES = ", ".join(dict.fromkeys(f.arch for f in (*FAMILIES.values(), diffusion_gemma.FAMILY)))

__all__ = ["FORMAT_VERSION", "OUTTYPES", "TAKES", "convert_hf"]
