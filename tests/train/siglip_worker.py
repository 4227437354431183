"""One rank of tests/train/test_siglip_exchange.py's gloo mesh (spawned; imports only torch and train.loss): its
rows of the global batch through every train.siglip_exchange mode, first with all the spawned ranks, then again
on a default group of the first 2 ranks alone."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from train.loss import SigLipLoss

B, D = 3, 8  # an odd b: bidir's backward sends 2 rows one way and 1 the other
MODES = ("gather", "shift", "bidir")
INPUTS = ("images", "texts", "scale", "bias")


def global_batch(world: int) -> tuple[torch.Tensor, ...]:
    """Image and text features [world * B, D], L2-normalised, and the exp'd scale and the bias, shape [1]."""
    g = torch.Generator().manual_seed(world)
    images, texts = (F.normalize(torch.randn(world * B, D, generator=g), dim=-1) for _ in range(2))
    return images, texts, torch.tensor([5.0]), torch.tensor([-3.0])


def measure(loss_fn, *inputs: torch.Tensor) -> dict:
    """One call's loss, the gradients of its four inputs and the bytes its forward saves for the backward."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    seen = {}

    def pack(t):
        seen[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(*leaves)
    loss.backward()
    return {"loss": loss.detach(), "saved": sum(seen.values())} | {k: t.grad for k, t in zip(INPUTS, leaves)}


def on_mesh(rank: int, world: int, folder: str) -> None:
    """This rank's results on a default group of `world` ranks, written to FOLDER/WORLD-RANK.pt."""
    dist.init_process_group("gloo", init_method=f"file://{folder}/store{world}", rank=rank, world_size=world)
    images, texts, scale, bias = global_batch(world)
    rows = slice(rank * B, (rank + 1) * B)
    out = {mode: measure(SigLipLoss(exchange=mode), images[rows], texts[rows], scale, bias) for mode in MODES}
    torch.save(out, f"{folder}/{world}-{rank}.pt")
    dist.destroy_process_group()


def rank_worker(rank: int, world: int, folder: str) -> None:
    """torch.multiprocessing.spawn's entry: all `world` ranks, then ranks 0 and 1 as a world of 2."""
    torch.set_num_threads(1)
    on_mesh(rank, world, folder)
    if rank < 2:
        on_mesh(rank, 2, folder)
