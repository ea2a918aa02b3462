"""diffuse: a CPU inference engine for masked diffusion language models (LLaDA, Dream)."""
import os

# ggml runs on OpenMP threads. libgomp's default makes idle threads spin, and a spinning pool
# collapses when anything else wants a core (a 2-thread pass here: 1.6-9 s instead of 0.56 s while
# another process ran); sleeping threads cost nothing measurable. Read once, when libgomp loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from diffuse._core import DiffuseError, physical_cores  # noqa: E402
from diffuse.model import Model, load  # noqa: E402

__all__ = ["DiffuseError", "Model", "load", "physical_cores"]
__version__ = "0.1.0"
