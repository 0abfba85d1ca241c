"""No params value reaches a shell: DVC runs every stage's `cmd` through one, so no command in
dvc.yaml interpolates a value (`${...}`), quoted or not (a value may hold the quote). The
predict stage learns its entry from $DVC_STAGE instead (tests/e2e/test_hostile_names.py runs
hostile names through dvc itself)."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import PROJECT
from wellfed.use.predict import stage_entry


def commands() -> dict[str, str]:
    stages = yaml.safe_load((PROJECT / "dvc.yaml").read_text())["stages"]
    return {name: (stage.get("do") or stage)["cmd"] for name, stage in stages.items()}


def test_no_stage_command_interpolates_a_value():
    found = commands()
    assert len(found) == 6 and "predict" in found
    assert {name: cmd for name, cmd in found.items() if "${" in cmd} == {}


@pytest.mark.parametrize("addressing, name", [("predict@reviews", "reviews"),
                                              ("sub/dvc.yaml:predict@a-b_1", "a-b_1")])
def test_the_predict_stage_finds_its_entry_in_dvc_stage(addressing, name):
    assert stage_entry(addressing, {"reviews": "r.csv", "a-b_1": "x.csv"}) == name


def test_without_dvc_stage_or_with_an_unknown_entry_it_says_what_to_run():
    with pytest.raises(ValueError) as err:
        stage_entry("", {"reviews": "r.csv"})
    assert str(err.value) == (
        "stages/predict.py is DVC's stage predict@<name>, and takes <name> from $DVC_STAGE, "
        "which is not set; run dvc repro predict@<name>, or wellfed-predict MODEL INPUT OUTPUT "
        "for any file")
    with pytest.raises(ValueError, match=r"^predict.inputs has no entry 'gone' \(the stage "
                                         r"predict@gone\); add it"):
        stage_entry("predict@gone", {"reviews": "r.csv"})
    with pytest.raises(ValueError, match="which is 'train'"):
        stage_entry("train", {"reviews": "r.csv"})
