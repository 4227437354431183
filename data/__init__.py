"""Training data: webdataset shards -> (images, tokens) batches, and the embedded synthetic data set.

Nothing here imports the rest of the project: the image transform and the tokenizer are passed in.
"""

from data.config import DataConfig
from data.errors import SKIP_CAUSES, DataError
from data.shards import TrainData, build_train_data
from data.synthetic import make_synthetic

__all__ = ["SKIP_CAUSES", "DataConfig", "DataError", "TrainData", "build_train_data", "make_synthetic"]
