"""Validation batches of one padded width against batches cut across widths, on this CPU.

SST-2's 872 dev rows through all-MiniLM-L6-v2 (pretrained, eval mode, fp32), the batches
wellfed validates with (data/batching.py's `eval_batches`, 128 rows at most: train/step/
validation.py's eval spec at micro-batch 32) against the same rows cut as before 2026-11-29
(the longest-first order cut at 128 rows whatever the widths: `cut`, which pads a batch's rows
to its first row's width and so needs a mask), each forward as wellfed's `device.forward` runs
it (no mask where a batch has no padding). On 1 thread (a search's group of one) and 2 (the
pipeline), in the order old, new, new, old, three times; figure: the old side's seconds over the
new side's (fastest of each), the tokens computed by each, and the largest gap between their
logits.

usage: python benchmarks/eval_batches.py  -> benchmarks/results/eval_batches.json
"""

from __future__ import annotations

import time

import numpy as np

import harness

NAME = "eval_batches"


def main() -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from wellfed import device as dev
    from wellfed.data.batching import BatchSpec, cut, eval_batches

    harness.require_sst2(NAME)
    clock = harness.Clock()
    source = harness.model_path()
    tokenizer = AutoTokenizer.from_pretrained(source)
    texts, _ = harness.read_sst2("dev")
    ids = [tokenizer(t, truncation=True, max_length=128)["input_ids"] for t in texts]
    lengths = np.array([len(i) for i in ids])
    spec = BatchSpec(global_batch=128, world_size=1, micro_rows=128)
    order = np.argsort(-lengths, kind="stable")
    sides = {"across_widths": cut(order, lengths, spec), "one_width": eval_batches(lengths, spec, 0)}

    def hosts(batches):
        out = []
        for idx in batches:
            width = int(lengths[idx].max())
            rows = np.zeros((len(idx), width), np.int64)
            mask = np.zeros_like(rows)
            for i, r in enumerate(idx):
                rows[i, :lengths[r]], mask[i, :lengths[r]] = ids[r], 1
            host = {"input_ids": rows, "attention_mask": mask}
            out.append((host, {k: torch.from_numpy(v) for k, v in host.items()}, idx))
        return out

    built = {name: hosts(b) for name, b in sides.items()}
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        source, num_labels=2, attn_implementation="sdpa").eval()
    cases = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        seconds = {name: [] for name in built}
        logits = {}
        with torch.inference_mode():
            for rep in range(3):
                for name in (("across_widths", "one_width", "one_width", "across_widths")
                             if rep % 2 == 0 else ("one_width", "across_widths",
                                                   "across_widths", "one_width")):
                    started = time.perf_counter()
                    out = np.zeros((len(lengths), 2), np.float32)
                    for host, batch, idx in built[name]:
                        out[idx] = dev.forward(model, batch, host).numpy()
                    seconds[name].append(time.perf_counter() - started)
                    logits[name] = out
        a, b = min(seconds["across_widths"]), min(seconds["one_width"])
        cases.append({"threads": threads, "across_widths_s": [round(s, 3) for s in seconds["across_widths"]],
                      "one_width_s": [round(s, 3) for s in seconds["one_width"]],
                      "speedup": harness.ratio(a / b, None, of="across widths (fastest)",
                                               over="one width (fastest)"),
                      "largest_logit_gap": float(np.abs(logits["across_widths"]
                                                        - logits["one_width"]).max())})
        print(f"[bench] {threads} thread(s): one width {a / b:.2f}x faster ({b:.2f} s against "
              f"{a:.2f} s); largest logit gap {cases[-1]['largest_logit_gap']:.2g}", flush=True)
    tokens = {name: int(sum(len(idx) * int(lengths[idx].max()) for idx in b))
              for name, b in sides.items()}
    harness.write_result(NAME, {"machine": harness.machine(), **clock.summary(),
                                "rows": len(lengths), "model": "all-MiniLM-L6-v2",
                                "batches": {n: len(b) for n, b in sides.items()},
                                "tokens_computed": tokens, "cases": cases})


if __name__ == "__main__":
    main()
