"""diffuse: a CPU inference engine for masked diffusion language models (LLaDA, Dream)."""
import os

# ggml runs on OpenMP threads and meets them at a barrier after each of a pass's ~600 graph nodes.
# libgomp's default spins about 3 ms there, and such a pool collapses when anything else wants a
# core (a 2-thread pass: 1.6-9 s instead of 0.56 s while another process ran); threads that sleep
# at once (OMP_WAIT_POLICY=PASSIVE) pay a wake-up per node: a 1-row block step at depth 512 took
# 35.8 ms on 2 threads. A short spin (10000 rounds, ~0.1 ms) took 23.5 ms, and 22.7 ms beside a
# process spinning on one of the two cores (passive: 41.9). Read once, when libgomp loads; the
# user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")

from diffuse._core import DiffuseError, physical_cores  # noqa: E402
from diffuse.model import Model, load  # noqa: E402

__all__ = ["DiffuseError", "Model", "load", "physical_cores"]
__version__ = "0.1.0"
