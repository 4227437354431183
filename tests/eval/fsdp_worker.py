"""Run under torchrun (2 gloo processes): tiny-s with its blocks sharded by torch's fully_shard, gathered into a
full copy on every rank (train.main.full_copy) and evaluated with each rank scoring half of the images.

    python -m torch.distributed.run --nproc_per_node 2 -m tests.eval.fsdp_worker DATASET OUT.json SEED
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import models
from eval.sharding import Shard
from eval.zeroshot import evaluate
from train.main import full_copy


def main(dataset: str, out: str, seed: int) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    cfg = models.ModelConfig(name="tiny-s")
    model = models.build_clip(cfg)
    plain = {k: v.clone() for k, v in model.state_dict().items()}
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in [m for m in model.modules() if type(m).__name__ == "Block"]:
        fully_shard(block, mesh=mesh)
    sharded = sum(hasattr(p, "full_tensor") for p in model.parameters())
    copy = full_copy(model, cfg, "cpu")
    same = all(torch.equal(copy.state_dict()[k], v) for k, v in plain.items())
    _, transform = models.transforms(cfg)
    shard = Shard(dist.get_rank(), dist.get_world_size())
    result = evaluate(copy, dataset=dataset, tokenizer=models.tokenizer(cfg), transform=transform, shard=shard)
    if shard.rank == 0:
        with open(out, "w") as f:
            json.dump({**result, "sharded_parameters": sharded, "weights_equal": same}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
