import pytest
import yaml

from wellfed.config import SECTIONS, TrainConfig, load_params, load_section

PROJECT_PARAMS = __import__("pathlib").Path(__file__).resolve().parents[1] / "params.yaml"


def test_every_section_of_the_project_params_loads():
    sections = load_params(PROJECT_PARAMS, *SECTIONS)
    assert len(sections) == len(SECTIONS) == 9
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


@pytest.mark.parametrize("text, value", [
    ("3e-05", 3e-05), ("3e-5", 3e-05), ("1E-4", 1e-4), (".5", 0.5), ("2.", 2.0), ("+1e-3", 1e-3),
    ("0.00003", 3e-05), ("'1e-4'", 1e-4), ("2", 2.0), ("1.0e+1", 10.0)])
def test_a_float_reads_as_a_number_however_it_is_written(tmp_path, text, value):
    path = tmp_path / "params.yaml"
    path.write_text(f"train:\n  max_grad_norm: {text}\n  weight_decay: {text}\n")
    (train,) = load_params(path, "train")
    assert train.max_grad_norm == value and type(train.max_grad_norm) is float
    assert train.weight_decay == value and type(train.weight_decay) is float


def test_dvc_writes_small_floats_in_a_spelling_pyyaml_reads_as_a_string(tmp_path):
    # `dvc exp run -S train.lr=3e-5` writes `lr: 3e-05`: YAML 1.1 floats need a dot.
    assert yaml.safe_load("lr: 3e-05") == {"lr": "3e-05"}
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  lr: 3e-05\n")
    (train,) = load_params(path, "train")
    assert train.lr == 3e-05


@pytest.mark.parametrize("text, value", [("1e3", 1000), ("2.0", 2), ("1E+2", 100), ("'7'", 7),
                                         ("+3", 3), ("1_000", 1000)])
def test_an_integer_reads_as_one_when_it_is_integral(tmp_path, text, value):
    path = tmp_path / "params.yaml"
    path.write_text(f"train:\n  epochs: {text}\n  max_steps: {text}\n")
    (train,) = load_params(path, "train")
    assert train.epochs == train.max_steps == value and type(train.epochs) is int


@pytest.mark.parametrize("key, text, message", [
    ("train.lr", "fast", "train.lr must be a number; got 'fast'"),
    ("train.lr", "'1e-4x'", "train.lr must be a number; got '1e-4x'"),
    ("train.lr", ".nan", "train.lr must be a number; got nan"),
    ("train.lr", "'inf'", "train.lr must be a number; got 'inf'"),
    ("train.lr", "true", "train.lr must be a number; got True"),
    ("train.lr", "'1,5'", "train.lr must be a number; got '1,5'"),
    ("train.epochs", "2.5", "train.epochs must be an integer; got 2.5"),
    ("train.epochs", "'3e-05'", "train.epochs must be an integer; got '3e-05'"),
    ("train.epochs", "1e400", "train.epochs must be an integer; got '1e400'"),
    ("train.epochs", "yes", "train.epochs must be an integer; got True"),
    ("tokenize.max_length", "'128 tokens'", "tokenize.max_length must be an integer; got '128 tokens'"),
    ("prepare.val_fraction", "'1e-1%'", "prepare.val_fraction must be a number; got '1e-1%'"),
])
def test_real_non_numbers_are_still_named(tmp_path, key, text, message):
    section, name = key.split(".")
    path = tmp_path / "params.yaml"
    path.write_text(f"{section}:\n  {name}: {text}\n")
    with pytest.raises(ValueError) as err:
        load_params(path, section)
    assert str(err.value) == f"{path}: {message}"


def test_every_numeric_field_of_every_section_takes_the_dvc_spelling():
    import dataclasses
    import typing

    fields = [(name, f.name, hint) for name, cls in SECTIONS.items()
              for f in dataclasses.fields(cls)
              for hint in [typing.get_type_hints(cls)[f.name]] if hint in (int, float)]
    assert len(fields) >= 25  # 25 when written; sections only gain fields
    for name, key, hint in fields:
        default = getattr(SECTIONS[name](), key)
        written = f"{default:.0e}" if hint is float and default else f"{float(default):e}"
        section = load_section({name: {key: written}}, name)
        assert getattr(section, key) == pytest.approx(default) and type(getattr(section, key)) is hint, key


@pytest.mark.parametrize("alias", ["latest", "v3", "best model", "a/b"])
def test_a_champion_alias_mlflow_would_refuse_is_named_with_the_fix(alias):
    with pytest.raises(ValueError, match=r"mlflow.champion_alias must be letters, digits"):
        load_section({"mlflow": {"champion_alias": alias}}, "mlflow")
    assert load_section({"mlflow": {"champion_alias": ""}}, "mlflow").champion_alias == ""
