import pytest

from wellfed.config import SECTIONS, TrainConfig, load_params, load_section

PROJECT_PARAMS = __import__("pathlib").Path(__file__).resolve().parents[1] / "params.yaml"


def test_every_section_of_the_project_params_loads():
    sections = load_params(PROJECT_PARAMS, *SECTIONS)
    assert len(sections) == len(SECTIONS) == 7
    assert [type(s) for s in sections] == list(SECTIONS.values())


def test_bad_values_are_all_reported_at_once_with_their_keys():
    params = {"train": {"precision": "fp8", "lr": "fast", "epochs": 0, "lrr": 1}}
    with pytest.raises(ValueError) as err:
        load_section(params, "train")
    msg = str(err.value)
    assert "train.precision must be one of auto, bf16, fp16, fp32; got 'fp8'" in msg
    assert "train.lr must be a number; got 'fast'" in msg
    assert "unknown key 'train.lrr' (did you mean 'train.lr'?)" in msg


def test_range_checks_run_when_types_are_right():
    with pytest.raises(ValueError, match=r"train.epochs must be >= 1; got 0"):
        load_section({"train": {"epochs": 0}}, "train")
    with pytest.raises(ValueError, match=r"prepare.val_fraction must be in \(0, 0.5\)"):
        load_section({"prepare": {"val_fraction": 0.9}}, "prepare")


def test_unknown_section_and_yaml_bool_for_literal(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("trian: {}\nray:\n  use_gpu: false\n")
    with pytest.raises(ValueError, match=r"unknown section 'trian' \(did you mean 'train'\?\)"):
        load_params(path, "ray")
    path.write_text("ray:\n  use_gpu: false\n")
    (ray,) = load_params(path, "ray")
    assert ray.use_gpu == "false"


def test_integers_are_accepted_for_floats_and_sections_are_frozen():
    cfg = load_section({"train": {"max_grad_norm": 2}}, "train")
    assert cfg.max_grad_norm == 2.0 and isinstance(cfg.max_grad_norm, float)
    with pytest.raises(AttributeError):
        cfg.lr = 0.5


def test_accumulation_steps_derive_from_world_size():
    cfg = TrainConfig(global_batch_size=64, micro_batch_size=8)
    assert [cfg.accumulation_steps(w) for w in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
