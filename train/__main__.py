"""`python -m train CONFIG.yaml [section.key=value ...]`; errors the user can fix are one line on stderr, exit code
1. The config is checked before the training code is imported (open_clip, torchvision, timm, accelerate take
seconds), so a typo is answered at once."""

import sys

from train.config import ConfigError, load_config

if sys.argv[1:2] not in (["-h"], ["--help"]):
    try:
        load_config(sys.argv[1:], warn=False)
    except ConfigError as e:
        sys.stderr.write(f"error: {e}\n")  # one write per line: ranks share stderr (train/main.py cli)
        sys.exit(1)

from train import main as entry

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(entry.__doc__)
    sys.exit(0)
sys.exit(entry.cli())
