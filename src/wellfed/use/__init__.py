"""Using a trained model: the model-directory contract and MLflow pyfunc (serving), predict files."""
