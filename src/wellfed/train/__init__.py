"""The train phase, by concern: step/ (the step engine: the loop on one device, no Ray),
checkpoints/ (the checkpoint layout, store and stops), outputs/ (what a run leaves behind: the
export, reports, MLflow logging) and run/ (one run driven: preflight, resume, the engine, in
process or on Ray). Imports flow one way: run/ imports the other three, step/ and outputs/ import
checkpoints/ only, checkpoints/ none of them (docs/layout.md; tests/test_import_cycles.py)."""
