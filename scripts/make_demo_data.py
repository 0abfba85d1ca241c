"""Generate the bundled synthetic demo dataset in data/raw (run once; the output is committed).

The rows are *synthetic*: short product/movie reviews assembled from templates with a
sentiment label (negative/neutral/positive) and some label noise, sized so that `make run`
trains and evaluates in a few minutes on 2 CPU cores. It is a smoke test of the pipeline,
not a benchmark; use SST-2 or your own data for real numbers (see README).

usage: python scripts/make_demo_data.py [OUT_DIR]
"""

import csv
import random
import sys
from pathlib import Path

SUBJECTS = ["the film", "this movie", "the plot", "the acting", "the soundtrack", "the camera work",
            "the script", "the ending", "the cast", "this product", "the battery", "the screen",
            "the service", "the hotel room", "the food", "the delivery", "the app", "the book"]
WORDS = {
    "positive": ["wonderful", "delightful", "excellent", "moving", "brilliant", "charming",
                 "superb", "a joy", "well made", "great value", "fantastic", "memorable"],
    "negative": ["terrible", "boring", "awful", "a waste of time", "painfully slow", "broken",
                 "disappointing", "clumsy", "dull", "overpriced", "a mess", "forgettable"],
    "neutral": ["fine", "average", "as expected", "ordinary", "acceptable", "neither good nor bad",
                "standard", "about what you would expect", "okay", "unremarkable but working"],
}
FRAMES = ["{s} was {w} .", "honestly , {s} is {w} .", "i thought {s} was {w} and i would say so again .",
          "{s} ? {w} .", "after two weeks , {s} still feels {w} .", "my friends agreed that {s} was {w} .",
          "{w} , that is all i can say about {s} .", "overall {s} turned out {w} , {extra}"]
EXTRAS = ["nothing more to add .", "as the reviews said .", "which surprised nobody .",
          "even on a second look .", "though the price was right .", "compared to the last one ."]


def row(rng: random.Random) -> tuple[str, str]:
    label = rng.choice(sorted(WORDS))
    text = rng.choice(FRAMES).format(s=rng.choice(SUBJECTS), w=rng.choice(WORDS[label]),
                                     extra=rng.choice(EXTRAS))
    if rng.random() < 0.05:  # label noise keeps accuracy below 100%
        label = rng.choice(sorted(WORDS))
    return text, label


def unique_rows(rng: random.Random, n: int, seen: set[str]) -> list[tuple[str, str]]:
    """`n` rows whose texts appear nowhere else in the dataset: no duplicates, no text with two
    labels, no leak between splits (prepare would report each; ~8,000 distinct texts exist)."""
    rows = []
    while len(rows) < n:
        text, label = row(rng)
        if text not in seen:
            seen.add(text)
            rows.append((text, label))
    return rows


def main(out: Path) -> None:
    rng = random.Random(20261122)
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    for name, n in (("train.tsv", 3000), ("dev.tsv", 300), ("test.tsv", 300)):
        with open(out / name, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter="\t", lineterminator="\n")
            writer.writerow(["sentence", "label"])
            writer.writerows(unique_rows(rng, n, seen))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "data/raw"))
