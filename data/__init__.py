"""Training data: webdataset shards -> (images, tokens) batches, and the embedded synthetic data set.

Nothing here imports the rest of the project: the image transform and the tokenizer are passed in.
"""

import importlib

from data.config import DataConfig
from data.errors import SKIP_CAUSES, DataError

__all__ = ["SKIP_CAUSES", "DataConfig", "DataError", "TrainData", "build_train_data", "make_synthetic"]
# imported on first use: the config alone (train.config) needs no webdataset, so that GPU checks on synthetic
# batches run where it is not installed
LAZY = {"TrainData": "data.shards", "build_train_data": "data.shards", "make_synthetic": "data.synthetic"}


def __getattr__(name: str):
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'data' has no attribute {name!r}")
