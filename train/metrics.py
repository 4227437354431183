"""Training speed as GPU users read it: samples/s (all ranks, and per GPU), model TFLOP/s per GPU, peak memory."""

from __future__ import annotations

import time

import torch

# progress-bar names of the figures
SHORT = {"samples_per_s_per_gpu": "samples/s/gpu", "tflops_per_gpu": "TFLOP/s/gpu", "max_memory_gb": "mem_GB"}


def train_tflops(gmacs_per_sample: float, samples_per_s: float) -> float:
    """Model FLOP/s of training, in TFLOP/s: 2 FLOPs per MAC x (forward + backward = 3 forwards), the usual
    6 x MACs per sample (Kaplan et al. 2020, sec. 2.1); recomputation (activation checkpointing, the cached
    features of accum_freq > 1) is not counted, so this is what MFU divides by the peak rate."""
    return 6 * gmacs_per_sample * 1e9 * samples_per_s / 1e12


class Throughput:
    """Rates over the steps since the previous measurement (the previous logging step), from wall time.

    The wall time between two logging steps is the GPU's time too: every step ends with the host waiting for
    its loss (train.dist.agree), so the host never runs more than a step ahead of the device.
    """

    def __init__(self, world_size: int, device: torch.device, gmacs_per_sample: float | None, samples_seen: int):
        self.world_size, self.device, self.gmacs = world_size, device, gmacs_per_sample
        self.time, self.samples = time.perf_counter(), samples_seen
        self.last: dict[str, float] = {}

    def measure(self, samples_seen: int) -> dict[str, float]:
        """{"samples_per_s", "samples_per_s_per_gpu", "tflops_per_gpu" (with GMACs), "max_memory_gb" (CUDA)}."""
        now = time.perf_counter()
        rate = (samples_seen - self.samples) / max(now - self.time, 1e-9)
        self.time, self.samples = now, samples_seen
        out = {"samples_per_s": rate, "samples_per_s_per_gpu": rate / self.world_size}
        if self.gmacs:
            out["tflops_per_gpu"] = train_tflops(self.gmacs, out["samples_per_s_per_gpu"])
        if self.device.type == "cuda":
            out["max_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self.last = out
        return out

    def restart(self, samples_seen: int) -> None:
        """Start the next measurement now (after an evaluation or a checkpoint, whose time is not training's)."""
        self.time, self.samples = time.perf_counter(), samples_seen

    def short(self) -> dict[str, float]:
        """The last figures under their progress-bar names."""
        return {SHORT[k]: v for k, v in self.last.items() if k in SHORT}
