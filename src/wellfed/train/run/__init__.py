"""One training run, driven: the checks before Ray starts (preflight), the run's name, storage
and resume (runs), its MLflow run (mlflow_run), the engine that trains it, in this process
(local) or on Ray Train (worker, ray_callback), a trial placed by Ray (placement), and what a
failure (failures), a lost node (lost_node) or a run finished after dvc had gone (orphan) leave
it; `driver.fit` reads top to bottom.

The top of train/: imports train/step, train/checkpoints and train/outputs; none of them
imports it."""
