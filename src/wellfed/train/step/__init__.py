"""The step engine: training on one device, no Ray. `loop.train` is the whole loop; around it
what it runs every step: the set-up of optimizer, schedule, scaler and batch plan (setup), host
micro-batches (feeding), one optimizer step (step), its planned shapes replayed as CUDA graphs
(graphs) with fused kernels (fusion) and one flat gradient buffer (gradients), the micro-batch
token budget (autobatch), validation (validation), the best checkpoint and early stopping
(selection), and what a worker reports (worker_report).

Imports train/checkpoints (a loop saves and resumes); never train/run or train/outputs, so
tests, benchmarks, a debugger and fused trials (train/trials) run it as it is."""
