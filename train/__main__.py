"""`python -m train CONFIG.yaml [section.key=value ...]`; errors the user can fix are one line on stderr, exit code 1."""
import sys

from .config import ConfigError
from .loop import TrainingError
from .main import main

try:
    sys.exit(main())
except (ConfigError, TrainingError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
