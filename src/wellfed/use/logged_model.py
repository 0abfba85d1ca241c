"""The exported model logged to MLflow as a pyfunc model and registered: the model folder as its
artifact, wellfed/use/serving.py (`classifier_model`) as its code, carried with what it imports
(CARRIED), so that it loads and serves wherever its pip requirements are installed, wellfed or
not; its signature and input example; a new version of the registered model, linked to the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from wellfed.use import serving

# The rows the logged model shows as its input example (and is checked on when it is logged):
# one short and one long, so the example also exercises padding.
EXAMPLE_TEXTS = ("A short example.",
                 "A longer example text, so that the two rows of the example differ in length.")


def example_input(spec: serving.ModelSpec) -> pd.DataFrame:
    return pd.DataFrame({name: list(EXAMPLE_TEXTS) for name in spec.text_columns})


def requirements() -> list[str]:
    """What the served model imports (wellfed itself travels in the model's code/ folder), at
    the versions this run used, without local tags such as +cpu that PyPI does not carry."""
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}"
            for name in ("mlflow", "torch", "transformers", "tokenizers", "numpy", "pandas")]


# The model's entry point, written into the model (MLflow's "models from code": nothing is
# pickled, so the model does not depend on pickle-compatible class paths or versions).
CARRIED = ("__init__.py", "use/__init__.py", "use/serving.py", "names.py", "device.py", "tasks.py",
           "texts.py")
"""The files of wellfed a logged model carries (serving and what it imports), as in the package."""
ENTRY_POINT = """import mlflow

from wellfed.use.serving import classifier_model

mlflow.models.set_model(classifier_model())
"""


@contextlib.contextmanager
def no_artifact_progress_bar():
    """MLflow draws a progress bar each time it copies a model's files (log_model loads the
    model back once to check the input example); the stage's console is for people."""
    before = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"]
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = before


def input_schema(spec: serving.ModelSpec):
    """The signature's inputs: the text column(s), typed Any. Typed string, MLflow's server
    cast each `inputs`/`instances` value to a string, so a null was answered as the text
    "None"; typed Any, a null reaches `text_columns` as null in every request format."""
    from mlflow.types.schema import AnyType, ColSpec, Schema

    return Schema([ColSpec(AnyType(), name) for name in spec.text_columns])


def log_model(uri: str, run_id: str, model_dir: str | Path, registered_name: str):
    """Log `model_dir` as a pyfunc model of run `run_id`, named `registered_name` in the run's
    Models column, and register it as a new version of `registered_name`, linked to the run and the logged
    model. Returns (MLflow's ModelInfo, the ModelVersion)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    import wellfed

    model_dir = Path(model_dir)
    predictor = serving.load(model_dir)
    example = example_input(predictor.spec)
    signature = mlflow.models.infer_signature(example, serving.predict(predictor, example))
    signature = mlflow.models.ModelSignature(inputs=input_schema(predictor.spec),
                                             outputs=signature.outputs)
    mlflow.set_tracking_uri(uri)
    with tempfile.TemporaryDirectory() as tmp:
        # The model carries the code it runs (CARRIED), so it loads and serves wherever its pip
        # requirements are installed, wellfed or not.
        package = Path(tmp, "wellfed")
        (package / "use").mkdir(parents=True)
        for name in CARRIED:
            shutil.copy(Path(wellfed.__file__).parent / name, package / name)
        entry = Path(tmp, "classifier.py")
        entry.write_text(ENTRY_POINT, encoding="utf-8")
        with no_artifact_progress_bar(), mlflow.start_run(run_id=run_id):
            info = mlflow.pyfunc.log_model(
                name=registered_name, python_model=str(entry), artifacts={"model": str(model_dir)},
                code_paths=[str(package)], signature=signature, input_example=example,
                pip_requirements=requirements(), tags={"wellfed.task": predictor.spec.task})
    # Registered through the client, which prints nothing (the fluent API prints two lines).
    client = mlflow.MlflowClient(uri)
    try:
        client.create_registered_model(registered_name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version = client.create_model_version(registered_name, info.model_uri, run_id=run_id,
                                          model_id=info.model_id)
    return info, version
