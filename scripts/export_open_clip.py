"""Export a trained run as an open_clip state dict: its weights, or the EMA of them (train.ema).

    python -m scripts.export_open_clip RUN_OR_CHECKPOINT OUT.safetensors [--ema]

RUN_OR_CHECKPOINT: a run directory (its newest complete checkpoint) or a checkpoint folder. OUT: a .safetensors
file, or any other name for torch.save. open_clip then loads it with
`open_clip.create_model(NAME, pretrained=OUT)` (tiny sizes after `import models.clip`). Softmax models only: open_clip
has no other attention (models.export_open_clip).
"""

from __future__ import annotations

import argparse
import sys

from models import export_open_clip
from models.clip import load_checkpoint
from models.run_folder import CheckpointError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a run directory or checkpoint folder written by python -m train")
    p.add_argument("out", help="the open_clip state dict to write (.safetensors, else torch.save)")
    p.add_argument("--ema", action="store_true", help="the EMA of the weights (ema.safetensors) in place of them")
    args = p.parse_args(argv)
    try:
        path = export_open_clip(load_checkpoint(args.checkpoint, ema=args.ema), args.out)
    except (CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
