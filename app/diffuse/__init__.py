"""diffuse: a CPU inference engine for masked diffusion language models (LLaDA, Dream)."""
from diffuse._core import DiffuseError
from diffuse.model import Model, load

__all__ = ["DiffuseError", "Model", "load"]
__version__ = "0.1.0"
