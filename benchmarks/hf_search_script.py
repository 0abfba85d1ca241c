"""The Trainer contender of benchmarks/search.py: `Trainer.hyperparameter_search` with Optuna,
as a user would write it for the same search: the same space (lr log-uniform, warmup ratio
uniform, weight decay a choice), the same number of trials, Optuna's TPE with the same random
start and seed, and its pruner on: SuccessiveHalvingPruner, the synchronous-free ASHA of
Optuna, with the same first rung and reduction factor. Each trial validates at the same rungs
(a callback asks the Trainer to evaluate there) and is ranked on validation macro-F1. Length
grouping, batch 32, 2 threads (the Trainer's own way to use the machine: one trial at a time).

usage: python benchmarks/hf_search_script.py TRAIN_TSV DEV_TSV OUT_DIR SPEC_JSON
SPEC_JSON: {"trials", "min_steps", "full", "reduction_factor", "lr": [lo, hi], "warmup": [lo,
hi], "weight_decay": [...], "searcher_seed", "startup", "model_dir" (optional: random init from
its config)}. Prints one JSON line: wall from process start, steps trained, each trial's steps
and whether it was pruned, and the best recipe in wellfed's names.
"""

import time

STARTED = time.time()

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402
from transformers import (AutoConfig, AutoModelForSequenceClassification,  # noqa: E402
                          AutoTokenizer, DataCollatorWithPadding, Trainer, TrainerCallback,
                          TrainingArguments)

import harness  # noqa: E402
from hf_trainer_script import tokenized  # noqa: E402
from train_throughput import grouping_args  # noqa: E402


class AtRungs(TrainerCallback):
    """Evaluate at the rungs (and nowhere else); count each trial's steps."""

    def __init__(self, rungs: set[int]):
        self.rungs, self.steps = rungs, []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.rungs:
            control.should_evaluate = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def main(train_tsv: str, dev_tsv: str, out_dir: str, spec_json: str) -> None:
    spec = json.loads(spec_json)
    torch.set_num_threads(harness.THREADS)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    model_dir = spec.get("model_dir") or harness.model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pretrained = bool(list(Path(model_dir).glob("*.safetensors")))

    def model_init(trial=None):
        if pretrained:
            return AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
        return AutoModelForSequenceClassification.from_config(
            AutoConfig.from_pretrained(model_dir, num_labels=2))

    train, dev = tokenized(train_tsv, tokenizer), tokenized(dev_tsv, tokenizer)

    def macro_f1(pred):
        predicted, gold = np.argmax(pred.predictions, -1), pred.label_ids
        scores = []
        for c in (0, 1):
            tp = ((predicted == c) & (gold == c)).sum()
            denom = (predicted == c).sum() + (gold == c).sum()
            scores.append(2 * tp / denom if denom else 0.0)
        return {"macro_f1": float(np.mean(scores))}

    rungs, full = set(), spec["full"]
    step = spec["min_steps"]
    while step < full:
        rungs.add(step)
        step *= spec["reduction_factor"]
    counter = AtRungs(rungs)
    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=32, per_device_eval_batch_size=64,
        max_steps=full, learning_rate=1e-4, weight_decay=0.01, warmup_steps=0.06,
        lr_scheduler_type="linear", max_grad_norm=1.0, seed=42, use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(), eval_strategy="steps", eval_steps=full,
        save_strategy="no", logging_steps=10, report_to="none", disable_tqdm=True,
        **grouping_args(TrainingArguments))
    trainer = Trainer(model_init=model_init, args=args, train_dataset=train, eval_dataset=dev,
                      processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer),
                      compute_metrics=macro_f1, callbacks=[counter])

    def hp_space(trial):
        return {"learning_rate": trial.suggest_float("learning_rate", *spec["lr"], log=True),
                "warmup_steps": trial.suggest_float("warmup_steps", *spec["warmup"]),
                "weight_decay": trial.suggest_categorical("weight_decay", spec["weight_decay"])}

    best = trainer.hyperparameter_search(
        hp_space=hp_space, compute_objective=lambda m: m["eval_macro_f1"],
        n_trials=spec["trials"], direction="maximize", backend="optuna",
        sampler=optuna.samplers.TPESampler(seed=spec["searcher_seed"],
                                           n_startup_trials=spec["startup"]),
        pruner=optuna.pruners.SuccessiveHalvingPruner(
            min_resource=spec["min_steps"], reduction_factor=spec["reduction_factor"]))
    wall = time.time() - STARTED
    hp = best.hyperparameters
    print(json.dumps({
        "wall_s": round(wall, 1), "steps": int(sum(counter.steps)), "trial_steps": counter.steps,
        "pruned": sum(1 for s in counter.steps if s < full), "best_value": best.objective,
        "best_recipe": {"train.lr": float(f"{hp['learning_rate']:.4g}"),
                        "train.warmup_ratio": float(f"{hp['warmup_steps']:.4g}"),
                        "train.weight_decay": hp["weight_decay"]}}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
