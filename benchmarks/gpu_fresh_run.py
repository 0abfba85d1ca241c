"""One training run in a fresh process, for benchmarks/gpu_scale.py: wellfed's own setup / feed /
train_step (what loop.train runs on each worker) from process start to a warm, timed window.

`python benchmarks/gpu_fresh_run.py '<spec json>'` prints one line `[result] {json}`. Every time in
`fresh` counts from WELLFED_BENCH_T0 (the parent's clock just before it started this process),
so imports, CUDA's first use, the shape plan, warm-ups, captures and compiles are inside it: the
time a DVC train stage pays. `warm` is the same process once every planned shape has been
captured (at most spec.warm more steps), timed over spec.timed steps or spec.seconds of wall
time. With spec.barrier it prints `[ready]` before the timed window and waits for a line on
stdin, so that processes sharing a GPU are timed together.

The model is loaded as a train stage loads it (wellfed.model.load_model of spec.weights, a
random-init encoder the parent saved without a head: gpu_throughput.save_encoder), so `fresh`
holds a weights load, not the benchmark's own random init. Its marks, each from process start:
imported_s (torch, wellfed's train path), group_ready_s (spec.group), cuda_ready_s (the CUDA
context), model_code_imported_s (transformers' BERT code and what it imports), model_loaded_s
(config, weights, a fresh head, on the CPU), on_device_s (copied to the GPU), setup_done_s
(wellfed's setup: shape plan, probe if any, buffers; then the compile if spec.compile),
first_step_done_s, done_s.

Imports only torch, transformers, numpy, pyarrow and wellfed's train path: no ray, mlflow, dvc.
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = float(os.environ.get("WELLFED_BENCH_T0") or time.time())


def since() -> float:
    return round(time.time() - T0, 3)


def main(spec: dict) -> dict:
    import torch

    from wellfed import device as dev
    from wellfed.config import ModelConfig, TrainConfig
    from wellfed.data.batching import collate
    from wellfed.data.token_files import TokenFile
    from wellfed.model import flops_per_token, load_model
    from wellfed.telemetry.meter import StepMeter
    from wellfed.telemetry.peak import Peak, table_peak
    from wellfed.train.step import fusion
    from wellfed.train.step.feeding import feed
    from wellfed.train.step.setup import setup
    from wellfed.train.step.step import train_step

    fresh = {"imported_s": since()}
    cuda = torch.cuda.is_available() and not spec["smoke"]
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    name = dev.device_name(device)
    if spec["group"]:  # a one-rank process group, as a Ray Train worker has
        torch.distributed.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"file://{spec['store']}", rank=0,
            world_size=1, **({"device_id": device} if cuda else {}))
        fresh["group_ready_s"] = since()
    torch.empty(1, device=device)
    sync()
    fresh["cuda_ready_s"] = since()
    data = TokenFile(spec["arrow"])
    from transformers import BertForSequenceClassification  # noqa: F401 - every kind is a BERT

    fresh["model_code_imported_s"] = since()
    torch.manual_seed(spec["seed"])  # the fresh head, as loop.train seeds it
    model = load_model(ModelConfig(name=spec["weights"]), spec["weights"],
                       ["negative", "positive"], pad_id=spec["pad"])
    fresh["model_loaded_s"] = since()
    model = model.to(device)
    sync()
    fresh["on_device_s"] = since()
    # The schedule spans the steps this process is likely to take (warmup 6% of them); more
    # run at its end's learning rate of 0, which changes nothing a timing reads.
    cfg = TrainConfig(epochs=1000, max_steps=spec["steps"] + spec["warm"] + (spec["timed"] or 500),
                      lr=spec["lr"], weight_decay=0.01, warmup_ratio=0.06,
                      global_batch_size=spec["batch"], micro_batch_size=spec["batch"],
                      micro_batch_tokens=spec["tokens"], max_grad_norm=1.0,
                      precision="bf16" if cuda else "fp32", seed=spec["seed"], cuda_graphs="true")
    s = setup(cfg, model, len(data), device, lengths=data.lengths)
    folder = None
    if spec["compile"]:
        folder = fusion.compile_shapes(s, spec["compile"]["root"], mode=spec["compile"]["mode"],
                                       backend="inductor" if cuda else "eager", device_name=name)
        cached_before = sum(len(files) for _, _, files in os.walk(folder))
    fresh["setup_done_s"] = since()
    torch.manual_seed(spec["seed"])  # dropout
    meter = StepMeter(device, Peak(1.0, "unused"), s.model.config)
    fed = feed(s, data, spec["arrow"], spec["pad"], epochs=cfg.epochs)
    g = s.graphs
    losses, real, padded = [], 0, 0
    progress = {"eager_micro_batches": 0}  # for a parent that cuts this run short

    def step_once():
        nonlocal real, padded
        step, batches = next(fed)
        losses.append(train_step(s, step, batches, meter, data.lengths,
                                 lambda idx: collate(data, idx, spec["pad"], s.spec)).loss)
        real, padded = real + step.real_tokens, padded + step.padded_tokens
        if g.eager != progress["eager_micro_batches"]:  # a new shape warmed up (and compiled)
            progress.update(at_s=since(), steps=len(losses), eager_micro_batches=g.eager,
                            graphs_captured=len(g.micro), capture_s=round(g.capture_s, 3))
            print("[progress] " + json.dumps(progress), flush=True)
        return step

    for i in range(spec["steps"]):
        step_once()
        if i == 0:
            sync()
            fresh["first_step_done_s"] = since()
    sync()
    fresh.update({"steps": spec["steps"], "real_tokens": real, "done_s": since()})
    fresh["real_tokens_per_s_from_start"] = round(real / fresh["done_s"], 1)
    fresh["real_tokens_per_s_after_setup"] = round(
        real / (fresh["done_s"] - fresh["setup_done_s"]), 1)
    fresh["graph_capture_s"] = round(g.capture_s, 3)

    def all_ready() -> bool:
        return set(s.spec.shapes()) <= set(g.micro if g.capture else g.warm)

    extra = 0
    while extra < spec["warm"] and not all_ready():
        step_once()
        extra += 1
    sync()
    if spec["barrier"]:
        print("[ready]", flush=True)
        sys.stdin.readline()
    start, real_before, padded_before, n, rows = time.perf_counter(), real, padded, 0, 0
    while True:
        step = step_once()
        n, rows = n + 1, rows + step.global_rows
        if spec["seconds"]:
            if n % 10 == 0:
                sync()
                if time.perf_counter() - start >= spec["seconds"]:
                    break
        elif n >= spec["timed"]:
            break
    sync()
    seconds = time.perf_counter() - start
    timed_real, timed_padded = real - real_before, padded - padded_before
    warm = {"extra_warm_steps": extra, "all_shapes_ready": all_ready(), "timed_steps": n,
            "seconds": round(seconds, 3), "ms_per_step": round(seconds * 1e3 / n, 3),
            "real_tokens_per_s": round(timed_real / seconds, 1),
            "padding_efficiency": round(timed_real / max(timed_padded, 1), 4)}
    peak = table_peak(name, "bf16") if cuda else None
    if peak:  # MFU of the real tokens; attention's cost per token at the computed width
        seq = timed_padded / max(rows, 1)
        warm["mfu_vs_table"] = round(warm["real_tokens_per_s"]
                                     * flops_per_token(s.model.config, seq) / peak.flops, 4)
        warm["peak_source"] = peak.source
    values = torch.stack(losses).float().cpu().tolist()
    facts = {"device": name, "path": "cuda_graphs" if g.capture else "planned_eager",
             "shapes": " ".join(f"{r}x{w}" for r, w in s.spec.shapes()),
             "micro_batch_tokens": s.spec.micro_tokens,
             "graphs_captured": len(g.micro) + (g.update is not None), "graph_replays": g.replays,
             "eager_micro_batches": g.eager, "capture_failed": g.failed,
             "all_reduce_in_graph": bool(g.flat.shared and g.update is not None),
             "group": bool(g.flat.shared), "losses_first_50": [round(x, 4) for x in values[:50]],
             "loss_last_20pct": round(sum(values[-max(1, len(values) // 5):])
                                      / max(1, len(values) // 5), 4),
             "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda
             else None}
    if folder is not None:
        facts["compile_cache"] = {"folder": folder.name, "files_before": cached_before,
                                  "files_after": sum(len(f) for _, _, f in os.walk(folder))}
    if spec["group"]:
        torch.distributed.destroy_process_group()
    return {"fresh": fresh, "warm": warm, "facts": facts}


if __name__ == "__main__":
    print("[result] " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
