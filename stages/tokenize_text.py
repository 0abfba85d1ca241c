"""tokenize: prepared splits -> one memory-mapped Arrow token file per split + tokenizer + stats.
# (Not named tokenize.py: a script of that name shadows the standard library module.)

usage: python stages/tokenize_text.py PREPARED_DIR TOKENS_DIR STATS_JSON
"""

import json
import os
from pathlib import Path

from wellfed.cli import stage
from wellfed.config import load_params
from wellfed.data.fingerprint import split_fingerprint
from wellfed.data.token_files import write_token_file
from wellfed.data.tokenization import SplitTokenizer, stats_line
from wellfed.model import load_tokenizer, resolve_source
from wellfed.outputs import atomic_path, check_room, write_json


@stage
def main(prepared_dir, tokens_dir, stats_json, *, budget):
    # This stage forks nothing, so the Rust tokenizer may use every core (Makefile and cli turn
    # it off for the stages that fork): SST-2 train encoded at 52-57k rows/s vs 31-35k on 2 cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    clock = budget.clock
    with clock("params"):
        tok_cfg, model_cfg = load_params("params.yaml", "tokenize", "model")
    prepared = Path(prepared_dir)
    label_info = json.loads((prepared / "labels.json").read_text())
    # Before the tokenizer loads: room for the token files (~4x the prepared Parquet: the demo's
    # 84 KB became 284 KB) and the tokenizer (~1 MB).
    size = sum(path.stat().st_size for path in prepared.glob("*.parquet"))
    check_room({Path(tokens_dir).parent: 4 * size + 2_000_000, Path(stats_json).parent: 0})
    with clock("tokenizer load"):
        tokenizer = load_tokenizer(resolve_source(model_cfg.name), model_cfg.trust_remote_code)
    # A pair for a model with token types (BERT-style): keep where the second segment starts.
    segments = (len(label_info.get("text_columns", [])) == 2
                and "token_type_ids" in tokenizer.model_input_names)
    stats, splits = {}, {}
    with atomic_path(tokens_dir, is_dir=True) as tmp, clock("tokenize + write"):
        for split_file in sorted(prepared.glob("*.parquet")):
            split = split_file.stem
            # Which rows, texts and labels: evaluate ranks models on one split by it.
            splits[split] = split_fingerprint(split_file, label_info["names"])
            encoder = SplitTokenizer(tokenizer, tok_cfg.max_length, tok_cfg.batch_rows)
            write_token_file(tmp / f"{split}.arrow",
                             encoder.batches(str(split_file), split, segments),
                             {"model_source": model_cfg.name,
                              "max_length": str(tok_cfg.max_length)})
            stats[split] = encoder.stats()
            line = stats_line(split, stats[split], tok_cfg.max_length, encoder.seconds)
            print(f"[wellfed] {line}")
        tokenizer.save_pretrained(tmp / "tokenizer")  # with its pad token: EOS for most decoders
        # model.name as written, not where it resolved (an absolute .venv path for `default`):
        # two clones of one commit then write the same bytes, and share a DVC cache.
        write_json(tmp / "meta.json", {"model_source": model_cfg.name,
                                       "labels": label_info["names"],
                                       "task": label_info.get("task", "single_label"),
                                       "text_columns": label_info.get("text_columns", ["text"]),
                                       "pad_id": tokenizer.pad_token_id,
                                       "max_length": tok_cfg.max_length,
                                       "split_fingerprints": splits})
    write_json(stats_json, stats)


if __name__ == "__main__":
    main()
