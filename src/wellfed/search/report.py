"""What a search found, in words and figures: the parent run's description, its metrics, the
console's closing lines and `data/search/<id>/result.json`."""

from __future__ import annotations

from wellfed.search import space


def compute(reports: dict[str, list], trials: int, full: int) -> dict:
    """Steps the search phase trained against the same trials each run to its full budget
    (a grid or a random search of as many recipes), and how many ASHA stopped early."""
    steps = [int(found[-1]["step"]) if found else 0 for found in reports.values()]
    stopped = sum(1 for s in steps if s < full)
    grid = len(steps) * full
    return {"trials": len(steps), "planned_trials": trials, "stopped_early": stopped,
            "steps": sum(steps), "grid_steps": grid,
            "share_of_grid": sum(steps) / grid if grid else None}


def winner(metric: str, best: dict, check: dict) -> str:
    """The winner in one sentence, its proven figure (the mean over the final check's seeds)
    first; then the search's best trial, whose figure is one seed's (often first by luck)."""
    top = check["finalists"][0]
    seeds = ", ".join(str(r["seed"]) for r in top["runs"])
    spread = f" ± {top['sd']:.4f}" if len(top["runs"]) > 1 else ""
    same = space.recipe_id(best["recipe"]) == space.recipe_id(top["recipe"])
    return (f"{space.shown(top['recipe'])}: {metric} {top['mean']:.4f}{spread}, the mean over "
            f"seed{'s' if len(top['runs']) > 1 else ''} {seeds} (final check, validation "
            f"split); in the search, {'its' if same else 'the best'} trial {best['trial']}"
            + ("" if same else f" ({space.shown(best['recipe'])})")
            + f" scored {best['value']:.4f} at step {best['step']} on one seed")


def describe(search_id: str, metric: str, best: dict, cost: dict, check: dict | None,
             winner_exp: str | None = None, winner_run: str | None = None) -> str:
    """The parent run's description (MLflow's run note), the winner's proven figure first."""
    lines = [f"## search {search_id}", ""]
    if check:
        lines.append(f"**Winner:** {winner(metric, best, check)}.")
        lines += [f"**At the edge:** {line}." for line in check.get("edges", [])]
    else:
        lines.append(f"**Best trial:** {space.shown(best['recipe'])} ({metric} "
                     f"{best['value']:.4f} at step {best['step']} on one seed, trial "
                     f"{best['trial']}).")
    share = cost["share_of_grid"]
    lines.append(
        f"**Compute:** {cost['trials']} trials ran ({cost['planned_trials']} asked"
        + ("; one finished just before a kill, and Tune proposed another in its place"
           if cost["trials"] > cost["planned_trials"] else "") + f"); {cost.get('stopper', 'ASHA')} stopped "
        f"{cost['stopped_early']} early. They trained {cost['steps']:,} steps, "
        + (f"{share:.0%} of the {cost['grid_steps']:,} that the same trials at full budget "
           "would (a grid of as many recipes)." if share is not None else "."))
    if check:
        lines.append(f"**Final check:** {check['text']}.")
        for f in check["finalists"]:
            runs = ", ".join(f"seed {r['seed']}: {r[metric]:.4f}" for r in f["runs"])
            lines.append(f"- {space.shown(f['recipe'])}: mean {f['mean']:.4f} ± {f['sd']:.4f} "
                         f"({runs})")
    if winner_exp:
        lines.append("")
        lines.append(f"**The winner as a DVC experiment:** `{winner_exp}`"
                     + (f", MLflow run {winner_run}" if winner_run else "")
                     + "; `@champion` moves to it only if it beats the holder on the test split.")
    return "\n".join(lines)


def metrics(cost: dict, best: dict, check: dict | None, metric: str) -> dict[str, float]:
    """The parent's figures (its row in the runs table)."""
    name = metric.removeprefix('val/')
    out = {f"search/best_{name}": best["value"],
           "search/trials": cost["trials"], "search/stopped_early": cost["stopped_early"],
           "search/steps": cost["steps"], "search/grid_steps": cost["grid_steps"]}
    if cost["share_of_grid"] is not None:
        out["search/share_of_grid"] = cost["share_of_grid"]
    if check:
        out[f"search/winner_{name}"] = check["finalists"][0]["mean"]  # over the seeds
    if check and "diff" in check:
        out["search/winner_minus_runner_up"] = check["diff"]
        out["search/winner_beats_runner_up"] = float(check["call"] == "beats")
    return out
