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


def describe(search_id: str, metric: str, best: dict, cost: dict, check: dict | None,
             winner_exp: str | None = None, winner_run: str | None = None) -> str:
    """The parent run's description (MLflow's run note), the best recipe first."""
    lines = [f"## search {search_id}", ""]
    lines.append(f"**Best recipe:** {space.shown(best['recipe'])} ({metric} {best['value']:.4f} "
                 f"at step {best['step']}, trial {best['trial']}).")
    share = cost["share_of_grid"]
    lines.append(
        f"**Compute:** {cost['trials']} trials ran ({cost['planned_trials']} asked"
        + ("; one finished just before a kill, and Tune proposed another in its place"
           if cost["trials"] > cost["planned_trials"] else "") + "); ASHA stopped "
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
    out = {f"search/best_{metric.removeprefix('val/')}": best["value"],
           "search/trials": cost["trials"], "search/stopped_early": cost["stopped_early"],
           "search/steps": cost["steps"], "search/grid_steps": cost["grid_steps"]}
    if cost["share_of_grid"] is not None:
        out["search/share_of_grid"] = cost["share_of_grid"]
    if check and "diff" in check:
        out["search/winner_minus_runner_up"] = check["diff"]
        out["search/winner_beats_runner_up"] = float(check["call"] == "beats")
    return out
