"""What a training run leaves behind: every worker's reports logged into the MLflow run and
their checkpoints registered (callback), the exported Hugging Face model (export), the train
stage's figures, histories and plots (reports), and data/train/run.json for evaluate
(run_record).

Imports train/checkpoints only; train/run drives it."""
