"""`python -m train CONFIG.yaml [section.key=value ...]`; errors the user can fix are one line on stderr, exit code
1."""

import sys

from data.errors import DataError
from models.layout import CheckpointError
from train import main as entry
from train.config import ConfigError
from train.loop import TrainingError

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(entry.__doc__)
    sys.exit(0)
try:
    sys.exit(entry.main())
except (ConfigError, TrainingError, CheckpointError, DataError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
