"""``python -m deepinfer.serve [MODEL] [flags]``: the serve command without the rest of the CLI."""
import sys

from deepinfer.serve.command import main

sys.exit(main())
