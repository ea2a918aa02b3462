"""`python -m diffuse.cli`: the `diffuse` command without its console script."""
import sys

from diffuse.cli import main

sys.exit(main())
