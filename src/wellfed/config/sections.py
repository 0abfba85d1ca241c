"""The params.yaml sections, by name."""

from __future__ import annotations

from wellfed.config.inputs import PrepareConfig, TokenizeConfig
from wellfed.config.running import MlflowConfig, PredictConfig, RayConfig
from wellfed.config.search import SearchConfig
from wellfed.config.training import DataConfig, ModelConfig, TrainConfig

SECTIONS: dict[str, type] = {
    "prepare": PrepareConfig,
    "tokenize": TokenizeConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "data": DataConfig,
    "ray": RayConfig,
    "mlflow": MlflowConfig,
    "predict": PredictConfig,
    "search": SearchConfig,
}
