"""The run's description, MLflow's run note (`mlflow.note.content`): the headline first.

The run page opens on it: how good the model is and on what, the task and the data, how fast it
trained and why, and where the model is in the registry. The train stage writes it when training
ends; evaluate writes it again with the test figures and the champion decision. Everything in it
is also a metric, tag or artifact of the run (the run's details, track/run_details.py, hold the
diagnosis, calibration and precision lines): the note is the reading order, not a new record.
"""

from __future__ import annotations

import json

from wellfed.track import run_details

NOTE = "mlflow.note.content"
"""The run tag MLflow's UI shows as the run's description."""
DIAGNOSIS = "diagnosis"
"""The run details' key of the diagnosis's first line (bottleneck and knob), from
data/train/speed/diagnosis.md."""
SHOWN_LABELS = 5  # label names listed in the note; the per-class table has them all


def diagnosis_line(markdown: str) -> str:
    """'Bottleneck: ... Knob: ...' from diagnosis.md (its first bold line), without the bold."""
    line = next((ln for ln in markdown.splitlines() if ln.startswith("**")), "")
    return line.replace("**", "").strip()


def split_rows(run) -> dict[str, int]:
    """Rows per split, from the run's `tokens/<split>` dataset inputs (tracking.log_datasets)."""
    rows = {}
    for given in run.inputs.dataset_inputs:
        profile = json.loads(given.dataset.profile or "{}")
        if given.dataset.name.startswith("tokens/") and "num_rows" in profile:
            rows[given.dataset.name.removeprefix("tokens/")] = int(profile["num_rows"])
    order = ("train", "validation", "test")  # MLflow returns the inputs in no fixed order
    return dict(sorted(rows.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 9))


def share(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def headline(run, task: str, evaluation: dict | None) -> str:
    """The first line: the test figures (the ranked one in bold), else the last validation."""
    from wellfed import tasks
    from wellfed.track import registry

    if evaluation:
        ranked = registry.headline(task)
        shown = " · ".join(f"**{k} {v:.4f}**" if k == ranked else f"{k} {v:.4f}"
                           for k, v in evaluation["figures"].items())
        return f"### {shown} on {evaluation['split']} ({evaluation['rows']:,} rows)"
    key = tasks.HEADLINE[task]
    value = run.data.metrics.get(key)
    figure = f"{key} {value:.4f}" if value is not None else "no validation figure"
    return f"### {figure} (last validation; the test split is scored by the evaluate stage)"


def compose(run, task: str, labels: list[str], *, model: dict | None = None,
            evaluation: dict | None = None, verdict=None, details: dict | None = None) -> str:
    """The note's markdown. `run`: the MLflow Run; `model`: the train stage's record of the
    logged and registered model (registered_model, model_version); `evaluation`: {split, rows,
    figures: {eval/...: value}}; `verdict`: wellfed.track.champion.Verdict; `details`: the
    run's details (track/run_details.py)."""
    from wellfed.track import ui_links

    m, p, t, d = run.data.metrics, run.data.params, run.data.tags, details or {}
    kind = "targets" if task == "regression" else "classes"
    names = ", ".join(str(n) for n in labels[:SHOWN_LABELS]) + (", ..." if len(labels) >
                                                               SHOWN_LABELS else "")
    rows = split_rows(run)
    lora = int(p.get("model.lora_r", 0) or 0)
    steps = int(p.get("train.max_steps", 0) or 0)
    lines = [headline(run, task, evaluation), "",
             f"- **task** {task}, {len(labels)} {kind} ({names})",
             "- **data** " + (", ".join(f"{split} {n:,}" for split, n in rows.items()) + " rows"
                              if rows else "token files not logged"),
             f"- **model** `{p.get('model.name', '?')}`, "
             f"{f'LoRA r={lora}' if lora else 'full fine-tuning'}, lr {p.get('train.lr', '?')}, "
             + (f"{steps} steps" if steps else f"{p.get('train.epochs', '?')} epoch(s)")
             + f", global batch {p.get('train.global_batch_size', '?')}"]
    best = next((k for k in m if k.startswith("best/val/")), None)  # driver.announce
    if best:
        lines.append(f"- **validation** {best.removeprefix('best/')} {m[best]:.4f} at step "
                     f"{int(m.get('train/best_step', 0))}, the exported model "
                     f"(train.select: {p.get('train.select', '?')})")
    if "train/real_tokens_per_s" in m:
        lines.append(f"- **speed** {m['train/real_tokens_per_s']:,.0f} real tokens/s, MFU "
                     f"{share(m.get('train/mfu'))}, padding efficiency "
                     f"{share(m.get('train/padding_efficiency'))}, input wait "
                     f"{share(m.get('train/input_wait_share'))}; "
                     f"{m.get('train/seconds', 0):.0f} s of training")
    if d.get(DIAGNOSIS):
        lines.append(f"- **diagnosis** {d[DIAGNOSIS]}")
    if d.get("derived", {}).get("precision_reason"):
        lines.append(f"- **precision** {t.get('derived.precision', '?')} "
                     f"({d['derived']['precision_reason']})")
    if d.get("calibration"):
        lines.append(f"- **calibration** {d['calibration']}")
    if model and model.get("model_version"):
        name, version = model["registered_model"], model["model_version"]
        where = f"[models:/{name}/{version}]({ui_links.model_version_route(name, version)})"
        if verdict is not None:
            alias = f"`models:/{name}@{verdict.alias}`"
            where += (f", now {alias}: {verdict.reason}" if verdict.moved else
                      f", {alias}: {verdict.reason}" if verdict.holder == verdict.version else
                      f"; {alias} {'stays' if verdict.holder == verdict.before else 'is now'} "
                      f"version {verdict.holder}: this one {verdict.reason}"
                      if verdict.holder else f", not {alias}: it {verdict.reason}")
        lines.append(f"- **registry** {where}")
    if evaluation and evaluation.get("table"):
        lines.append(f"- per-class figures: the table `{evaluation['table']}` (Artifacts)")
    if d:
        lines.append(f"- what wellfed decided and why, library versions, timings: "
                     f"`{run_details.ARTIFACT}` (Artifacts)")
    return "\n".join(lines) + "\n"


def write(uri: str, run_id: str, task: str, labels: list[str], **parts) -> str:
    """Compose the note from the run as MLflow has it now and set it; return the markdown."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    text = compose(client.get_run(run_id), task, labels, details=run_details.read(uri, run_id),
                   **parts)
    client.set_tag(run_id, NOTE, text)
    return text
