"""Where the champion alias points, and why, as one consistent step of the registry's own state.

The alias (`champion`, mlflow.champion_alias) belongs to the best evaluated version by the task's
headline figure (registry.headline) on the holder's split (the tokenize stage's fingerprint of
its row ids, texts and labels): versions scored on other test data, or on the validation split,
are never ranked against it, and a tie leaves the alias where it is. Every evaluated version's
tag `wellfed.champion.reason` says where it stands (`@champion: ...` on the holder, `not
@champion: ...` on the others, naming the figures compared), and its description (the first thing
its page shows, and the versions list's Description column) leads with its figure and recipe
before the same words (track/version_description.py).

Why no lock. MLflow's registry has no compare-and-set: setting an alias overwrites it, so "read
the holder, compare, move" in two processes at once lets the slower one move the alias back to
the worse version (two sweep trials finishing together), and a process killed between the move
and its tags leaves words that contradict the alias. A lock file reaches neither a tracking
server (http://, PostgreSQL behind it) nor processes on other machines; a lock made of registry
objects (a marker model created if absent) must expire when its holder is killed, and breaking a
stale lock is itself a race. Instead the decision is a function of the registry's state alone
(`plan`: every version's recorded figures, the holder, the exclusions), so every process that
looks computes the same answer, and `settle` applies it until a fresh read asks for nothing:

- each process writes only its own version's figures before it reads, and every later write
  of every process is followed by a read of that process;
- so the last process to finish has read after every write of every process, found the state
  consistent, and stopped: the final state is `plan`'s fixed point, whoever raced whom and
  wherever a process was killed (the next evaluate, a rerun included, repairs what a kill left).

The alias is then the best on the split whatever the order of evaluation. A version kept out of
the ranking by hand carries the tag `wellfed.champion.exclude` (any value); an alias pointed by
hand at a version wellfed never scored stays until pointed again, and one pointed at a scored
version on another split makes that split the one to judge by.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from wellfed.track.registry import (EXCLUDE, METRIC, PREVIOUS, REASON, RECIPE, SPLIT, SPLIT_NAME,
                                    VALUE, quoted)
from wellfed.track.version_description import describe, ours, recipe

ROUNDS = 10
"""Reads before `settle` gives up: two suffice after any interleaving of finished writers;
more means something keeps rewriting the tags."""
TRIES = 8
"""Attempts at a step the store refused because another writer collided with it, 0.05 s apart
and doubling (6.4 s in all). Two evaluations released together on a loaded 2-core machine were
refused, on sqlite, as TEMPORARILY_UNAVAILABLE (two transactions that each read before writing:
one is refused at once, whatever the busy timeout) and as a UNIQUE constraint on a version tag
(MLflow sets a tag by reading, then inserting: both inserted the same new tag)."""
ROLE_REFUSAL = "moves only for the role"
"""What the team store's server answers (403) when this login may not move a protected alias
(track/store_access.py)."""
COLLISIONS = ("UNIQUE constraint failed", "duplicate key value", "IntegrityError")
"""What sqlite and PostgreSQL say (also through a tracking server) when two writers inserted
the same row."""


@dataclass(frozen=True)
class Scored:
    """A version's evaluation as its tags record it."""

    version: str
    metric: str
    value: float
    split: str
    split_name: str
    recipe: str = ""
    """`lr 1e-4 bs 32` (version_description.recipe); empty for a version scored before it was
    recorded."""

    def figure(self) -> str:
        return f"{self.metric} {self.value:.4f} on the {self.split_name} split"

    def ranks_with(self, other: Scored) -> bool:
        return (self.split, self.metric) == (other.split, other.metric)


@dataclass(frozen=True)
class Standing:
    """The registry's state for one registered model and alias, as read at one moment."""

    holder: str | None
    scored: dict[str, Scored]
    """Version -> its complete evaluation record (versions being evaluated are absent)."""
    excluded: frozenset[str]
    reasons: dict[str, str]
    """Version -> its reason tag, for the scored versions that have one."""
    descriptions: dict[str, str]


@dataclass(frozen=True)
class Plan:
    """What the registry should say: where the alias points and each scored version's words."""

    holder: str | None
    reasons: dict[str, str]


@dataclass(frozen=True)
class Verdict:
    """One version's standing after its evaluation."""

    name: str
    version: str
    alias: str
    holder: str | None
    """The alias holder once the registry settled."""
    before: str | None
    """The holder when this evaluation first looked."""
    reason: str
    """The version's reason, without its `@alias: ` / `not @alias: ` head."""
    refused: str = ""
    """Why the tracking server refused to move the alias (a team store whose role `champion`
    this login lacks, docs/team.md#access); empty when nothing was refused."""

    @property
    def moved(self) -> bool:
        """Whether this evaluation moved the alias to this version."""
        return self.holder == self.version != self.before

    def line(self) -> str:
        """The console line: where the alias points now, and why."""
        uri = f"models:/{self.name}@{self.alias}"
        if self.refused:
            where = f"stays version {self.holder}" if self.holder else "is not set"
            return (f"{uri} {where}: the tracking server refused to move it ({self.refused}); "
                    f"version {self.version} is scored, and the next evaluation by the role "
                    f"'champion' ranks it (or, as one: python -m wellfed.track.champion "
                    f"{shlex.quote(self.name)} {shlex.quote(self.alias)})")
        if self.moved:
            return f"{uri} -> version {self.version}: {self.reason}"
        if self.holder is None:
            return f"{uri} is not set: version {self.version} {self.reason}"
        if self.holder == self.version:
            return f"{uri} stays version {self.version}: {self.reason}"
        now = "stays" if self.holder == self.before else "is now"  # a trial finishing alongside
        return f"{uri} {now} version {self.holder}: version {self.version} {self.reason}"


def number(version) -> str:
    """A version number as text (stores differ: sqlite gives int, REST str)."""
    return str(version.version)


def scored(version) -> Scored | None:
    tags = version.tags
    if not all(key in tags for key in (METRIC, VALUE, SPLIT, SPLIT_NAME)):
        return None
    try:
        value = float(tags[VALUE])
    except ValueError:
        value = math.nan
    return Scored(number(version), tags[METRIC], value, tags[SPLIT], tags[SPLIT_NAME],
                  tags.get(RECIPE, ""))


def description(record: Scored, reason: str, alias: str) -> str:
    """The description wellfed writes on `record`'s version for its `reason`."""
    return describe(reason, alias, record.metric, record.value, record.recipe)


def read(client, name: str, alias: str) -> Standing:
    """The registry's state for `name` and `alias`, in two requests."""
    versions = client.search_model_versions(f"name = {quoted(name)}")
    holder = client.get_registered_model(name).aliases.get(alias)
    records = {number(v): s for v in versions if (s := scored(v)) is not None}
    return Standing(str(holder) if holder is not None else None, records,
                    frozenset(number(v) for v in versions if EXCLUDE in v.tags),
                    {number(v): v.tags[REASON] for v in versions if REASON in v.tags},
                    {number(v): v.description or "" for v in versions})


def rankable(standing: Standing, record: Scored) -> bool:
    return math.isfinite(record.value) and record.version not in standing.excluded


def target(standing: Standing) -> str | None:
    """Where the alias belongs: the best rankable version on the holder's split (on the split of
    the first rankable version when nothing holds it); the holder on a tie, and the holder when
    wellfed never scored it (pointed by hand)."""
    holder = standing.holder
    held = standing.scored.get(holder) if holder is not None else None
    if holder is not None and held is None:
        return holder
    if held is None:
        first = [r for r in sorted(standing.scored.values(), key=lambda r: int(r.version))
                 if rankable(standing, r)]
        if not first:
            return None
        held = first[0]
    pool = [r for r in standing.scored.values() if r.ranks_with(held) and rankable(standing, r)]
    if not pool:
        return holder
    best = max(r.value for r in pool)
    top = [r.version for r in pool if r.value == best]
    return holder if holder in top else min(top, key=int)


def reason(standing: Standing, record: Scored, holder: str | None, alias: str) -> str:
    """The words for `record`'s version when `holder` holds the alias."""
    own = record.figure()
    if record.version == holder:
        if not rankable(standing, record):
            why = (f"excluded by hand (tag {EXCLUDE})" if record.version in standing.excluded
                   else f"scored {record.metric} {record.value}, not a finite figure")
            return f"@{alias}: held already; {why}, and no rankable version on its split"
        rivals = [r for r in standing.scored.values() if r.version != holder
                  and r.ranks_with(record) and rankable(standing, r)]
        if not rivals:
            return f"@{alias}: {own}; no other version was evaluated on this split"
        rival = max(rivals, key=lambda r: (r.value, -int(r.version)))
        if record.value > rival.value:
            return (f"@{alias}: {own} beats version {rival.version}'s {rival.value:.4f} on the "
                    "same split")
        return f"@{alias}: {own}, level with version {rival.version}; it held the alias first"
    if record.version in standing.excluded:
        return f"not @{alias}: excluded by hand (tag {EXCLUDE})"
    if not math.isfinite(record.value):
        return (f"not @{alias}: scored {record.metric} {record.value}: not a finite figure, "
                "never ranked")
    theirs = standing.scored.get(holder) if holder is not None else None
    if theirs is not None and theirs.ranks_with(record):
        return (f"not @{alias}: scored {own}, not above version {holder}'s {theirs.value:.4f} on "
                "the same split")
    scored_as = (f"{theirs.metric} on another split ({theirs.split_name}, fingerprint "
                 f"{theirs.split[:12]})" if theirs is not None else "no recorded evaluation")
    return (f"not @{alias}: scored {own}, and version {holder} has {scored_as}: the two cannot "
            f"be ranked; point the alias at version {record.version} by hand if this split is "
            "the one to judge by")


def plan(standing: Standing, alias: str) -> Plan:
    holder = target(standing)
    return Plan(holder, {v: reason(standing, r, holder, alias)
                         for v, r in standing.scored.items()})


def settle(client, name: str, alias: str, seen: list[Standing] | None = None) -> Standing:
    """Bring the alias and every scored version's reason and description in line with `plan`
    until a fresh read asks for no write (module docstring); return the settled state, and
    append the first read to `seen` when it is empty. The alias moves first, then the words: a
    kill between them leaves words the next evaluation rewrites."""
    for _ in range(ROUNDS):
        now = read(client, name, alias)
        if seen is not None and not seen:
            seen.append(now)
        wanted = plan(now, alias)
        words = {v: text for v, text in wanted.reasons.items() if now.reasons.get(v) != text}
        notes = {v: description(now.scored[v], text, alias)
                 for v, text in wanted.reasons.items()
                 if now.descriptions.get(v, "") != description(now.scored[v], text, alias)
                 and ours(now.descriptions.get(v, ""), alias)}
        if wanted.holder == now.holder and not words and not notes:
            return now
        if wanted.holder is not None and wanted.holder != now.holder:
            client.set_model_version_tag(name, wanted.holder, PREVIOUS, now.holder or "none")
            client.set_registered_model_alias(name, alias, wanted.holder)
        for version, text in words.items():
            client.set_model_version_tag(name, version, REASON, text)
        for version, text in notes.items():
            client.update_model_version(name, version, description=text)
    raise RuntimeError(f"models:/{name}@{alias} did not settle in {ROUNDS} rounds: something "
                       "keeps rewriting its versions' wellfed.* tags; evaluate again once it stops")


def patiently(step):
    """`step()`, again while the store refuses it for a colliding writer (TRIES): a refused
    write changed nothing, and `settle` starts from a fresh read, so trying again is safe."""
    import time

    from mlflow.exceptions import MlflowException

    for attempt in range(TRIES):
        try:
            return step()
        except MlflowException as err:
            collided = (err.error_code == "TEMPORARILY_UNAVAILABLE"
                        or any(words in str(err) for words in COLLISIONS))
            if not collided or attempt == TRIES - 1:
                raise
            time.sleep(0.05 * 2 ** attempt)


def promote(uri: str, name: str, version: str | int, alias: str, metric: str, value: float,
            split: str, split_name: str) -> Verdict:
    """Record what `version` scored, then settle the alias and the words (module docstring);
    return where `version` stands."""
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient(uri)
    version = str(version)
    record = ((RECIPE, run_recipe(client, name, version)), (METRIC, metric),
              (VALUE, repr(float(value))), (SPLIT, split), (SPLIT_NAME, split_name))
    for key, text in ((k, t) for k, t in record if t):  # the recipe first: complete with it
        patiently(lambda: client.set_model_version_tag(name, version, key, text))
    first: list[Standing] = []  # where the alias was when this evaluation first looked
    try:
        settled = patiently(lambda: settle(client, name, alias, first))
    except MlflowException as err:
        if ROLE_REFUSAL not in str(err):
            raise
        why = str(err).split("Permission denied: ", 1)[-1].split(";")[0]
        before = first[0].holder if first else None
        words = plan(first[0], alias).reasons.get(version, "") if first else ""
        return Verdict(name, version, alias, before, before, words, refused=why)
    words = settled.reasons[version]
    return Verdict(name, version, alias, settled.holder, first[0].holder,
                   words.removeprefix(f"@{alias}: ").removeprefix(f"not @{alias}: "))


def run_recipe(client, name: str, version: str) -> str:
    """The recipe of the run that made `version` (its params), "" when there is none."""
    from mlflow.exceptions import MlflowException

    try:
        run_id = client.get_model_version(name, version).run_id
        return recipe(client.get_run(run_id).data.params) if run_id else ""
    except MlflowException:  # a version made from a run since deleted, say
        return ""


def main(argv: list[str] | None = None) -> int:
    """`python -m wellfed.track.champion NAME [ALIAS]`: settle ALIAS (default champion) of the
    registered model NAME on the store MLFLOW_TRACKING_URI names, as `promote` does after an
    evaluation: what a team store left unmoved for a login without the role `champion`."""
    import sys

    import mlflow

    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        print("usage: python -m wellfed.track.champion NAME [ALIAS]", file=sys.stderr)
        return 2
    name, alias = args[0], (args[1:] or ["champion"])[0]
    client = mlflow.MlflowClient()
    settled = patiently(lambda: settle(client, name, alias))
    print(f"[wellfed] models:/{name}@{alias} is "
          f"{'version ' + settled.holder if settled.holder else 'not set'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
