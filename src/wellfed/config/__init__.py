"""Typed configuration: one frozen dataclass per params.yaml section (inputs.py, training.py,
running.py, search.py), with a docstring under every field (docs/reference/params.md is made from them).

Every section is loaded with `load_section`, which collects *all* problems (unknown keys with a
"did you mean", wrong types, out-of-range values) and raises them once as a `ValueError`, so a
user fixes params.yaml in one go instead of one traceback at a time.
"""


from wellfed.config.inputs import PrepareConfig, TokenizeConfig
from wellfed.config.loading import flatten, load_params, load_section
from wellfed.config.numbers import number
from wellfed.config.running import MlflowConfig, PredictConfig, RayConfig
from wellfed.config.search import SearchConfig
from wellfed.config.sections import SECTIONS
from wellfed.config.training import DataConfig, ModelConfig, TrainConfig

__all__ = [
    "PrepareConfig", "TokenizeConfig", "ModelConfig", "TrainConfig", "DataConfig", "RayConfig",
    "MlflowConfig", "PredictConfig", "SearchConfig", "load_section", "load_params", "flatten", "number",
    "SECTIONS",
]
