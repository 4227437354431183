"""`python -m train CONFIG.yaml [section.key=value ...]`; errors the user can fix are one line on stderr, exit code
1."""

import sys

from train import main as entry

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(entry.__doc__)
    sys.exit(0)
sys.exit(entry.cli())
