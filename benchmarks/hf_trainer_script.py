"""The contender of benchmarks/train_stage.py: the Hugging Face Trainer script a user would write.

Model load to saved model, the same recipe as wellfed's train stage (params.yaml): TSV in with
pandas, `Dataset.map` with the fast tokenizer (truncation 128), Trainer with length grouping,
1 epoch, batch 32, AdamW lr 1e-4, weight decay 0.01, 6% linear warmup (warmup_steps 0.06: a
ratio in transformers 5), clip 1.0, 2 threads,
validation every EVAL_EVERY steps (0: none during training, as wellfed's eval_every 0) and at
the end, then `save_model`. Prints one JSON line: the script's phases (seconds) and the final
validation accuracy.

On a CUDA GPU it trains there in bf16 with the Trainer's defaults (pinned memory); MODEL_DIR
(default: the packaged MiniLM, pretrained) may be a folder with a config only: random init.

usage: python benchmarks/hf_trainer_script.py TRAIN_TSV DEV_TSV OUT_DIR [EVAL_EVERY [LR [MODEL_DIR]]]
       (defaults: 50, 1e-4, MiniLM)
"""

import time

STARTED = time.time()

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import (AutoConfig, AutoModelForSequenceClassification,  # noqa: E402
                          AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments)

import harness  # noqa: E402
from train_throughput import grouping_args  # noqa: E402


def tokenized(path: str, tokenizer) -> Dataset:
    """A GLUE TSV as a Trainer script reads it: pandas (GLUE's TSV has bare quotes inside
    sentences: no quoting), then `Dataset.map` with the fast tokenizer, cut at 128 tokens."""
    frame = pd.read_csv(path, sep="\t", quoting=3)
    return Dataset.from_pandas(frame).map(
        lambda b: tokenizer(b["sentence"], truncation=True, max_length=128), batched=True,
        remove_columns=["sentence"])


def main(train_tsv: str, dev_tsv: str, out_dir: str, eval_every: str = "50",
         lr: str = "1e-4", model_dir: str = "") -> None:
    phases = {"imports": time.time() - STARTED}
    mark = time.time()
    cuda = torch.cuda.is_available()
    torch.set_num_threads(harness.THREADS)
    torch.manual_seed(42)
    model_dir = model_dir or harness.model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if list(Path(model_dir).glob("*.safetensors")) or list(Path(model_dir).glob("*.bin")):
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    else:  # a config only: random init, as wellfed's model.init random
        model = AutoModelForSequenceClassification.from_config(
            AutoConfig.from_pretrained(model_dir, num_labels=2))
    phases["model load"], mark = time.time() - mark, time.time()

    train, dev = tokenized(train_tsv, tokenizer), tokenized(dev_tsv, tokenizer)
    phases["tokenize"], mark = time.time() - mark, time.time()

    def accuracy(pred):
        return {"accuracy": float((np.argmax(pred.predictions, -1) == pred.label_ids).mean())}

    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=32, per_device_eval_batch_size=64,
        num_train_epochs=1, learning_rate=float(lr), weight_decay=0.01, warmup_steps=0.06,
        lr_scheduler_type="linear", max_grad_norm=1.0, seed=42, use_cpu=not cuda, bf16=cuda,
        dataloader_pin_memory=cuda, eval_strategy="steps" if int(eval_every) else "no",
        eval_steps=int(eval_every) or None, save_strategy="no",
        logging_steps=10, report_to="none", disable_tqdm=True, **grouping_args(TrainingArguments))
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=dev,
                      processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer),
                      compute_metrics=accuracy)
    trainer.train()
    phases["train (with evals)"], mark = time.time() - mark, time.time()
    final = trainer.evaluate()
    phases["final eval"], mark = time.time() - mark, time.time()
    trainer.save_model(out_dir)
    tokenizer.save_pretrained(out_dir)
    phases["save"] = time.time() - mark
    print(json.dumps({"phases": phases, "total_s": time.time() - STARTED,
                      "val_accuracy": final["eval_accuracy"]}))


if __name__ == "__main__":
    main(*sys.argv[1:7])
