"""Ray Tune's saved state of a search phase, checked before Tune reads it, as a checkpoint is.

`Tuner.restore` unpickles the phase folder (`tuner.pkl`, the searcher's state, the pickles
inside `experiment_state-*.json`): Ray's own docs say a folder others can write to runs their
code. So, before a resume, every pickle in it is read by an unpickler that resolves only the
names a search's state holds (`ALLOWED`: Ray Tune's configs, ASHA, Optuna's TPE, numpy's
arrays, this package's story of the search), as torch's `weights_only` does for a checkpoint:
a pickle naming anything else (`posix.system`, code pickled by value) never runs. A state file
cut short (a full disk under Ray's syncer) or refused is said in one line and the phase folder
is set aside (`tune-search.damaged`); the phase starts afresh and every trial the ledger holds
is handed back from it, not trained again (search/trial.py).

What the search itself writes (the ledger, the rungs, search.json) is JSON, written atomically
(outputs.write_json: a temporary file, then os.replace).
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

ALLOWED = {
    "builtins": {"set", "frozenset", "slice", "complex", "bytearray", "object"},
    "collections": {"OrderedDict", "defaultdict", "Counter", "deque"},
    "copyreg": {"_reconstructor"},
    "datetime": {"datetime", "timedelta", "timezone", "date"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "Path"},
    "uuid": {"UUID"},
    "numpy": {"dtype", "ndarray", "float64", "float32", "int64", "int32", "bool_"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "numpy.core.numeric": {"_frombuffer"},
    "numpy._core.numeric": {"_frombuffer"},
    "numpy.random._pickle": {"__randomstate_ctor", "__bit_generator_ctor", "__generator_ctor"},
    "numpy.random._mt19937": {"MT19937"},
    "numpy.random._pcg64": {"PCG64"},
    "numpy.random.mtrand": {"RandomState"},
    "pyarrow._fs": {"FileSystem._from_uri", "LocalFileSystem"},
    "optuna.distributions": {"FloatDistribution", "IntDistribution", "CategoricalDistribution"},
    "optuna.pruners._nop": {"NopPruner"},
    "optuna.samplers._lazy_random_state": {"LazyRandomState"},
    "optuna.samplers._random": {"RandomSampler"},
    "optuna.samplers._tpe.parzen_estimator": {"_ParzenEstimatorParameters", "_ParzenEstimator"},
    "optuna.samplers._tpe.sampler": {"TPESampler", "default_weights", "default_gamma"},
    "optuna.search_space.intersection": {"IntersectionSearchSpace"},
    "optuna.storages._in_memory": {"InMemoryStorage", "_StudyInfo"},
    "optuna.study._study_direction": {"StudyDirection"},
    "optuna.study.study": {"Study"},
    "optuna.trial._frozen": {"FrozenTrial"},
    "optuna.trial._state": {"TrialState"},
    "optuna.trial._trial": {"Trial"},
    "mlflow.tracking.client": {"MlflowClient"},
    "mlflow.tracking._tracking_service.client": {"TrackingServiceClient"},
    "mlflow.tracing.client": {"TracingClient"},
    "ray.air._internal.usage": {"AirEntrypoint"},
    "ray.tune.experimental.output": {"AirVerbosity"},
    "ray.train": {"SyncConfig", "CheckpointConfig", "FailureConfig", "RunConfig"},
    "ray.air.config": {"CheckpointConfig", "FailureConfig", "RunConfig"},
    "ray.tune": {"RunConfig", "CheckpointConfig", "FailureConfig", "SyncConfig", "TuneConfig"},
    "ray.tune.tune_config": {"TuneConfig"},
    "ray.tune.callback": {"_CallbackMeta"},
    "ray.tune.schedulers.async_hyperband": {"AsyncHyperBandScheduler", "_Bracket"},
    "ray.tune.search.optuna.optuna_search": {"OptunaSearch"},
    "ray.tune.search.variant_generator": {"_UnresolvedAccessGuard"},
    "ray.tune.search.sample": {"Categorical", "Float", "Integer", "Function", "_Uniform",
                               "_LogUniform", "Domain", "Sampler"},
    "ray.tune.search.basic_variant": {"BasicVariantGenerator", "_TrialIterator",
                                      "_VariantIterator"},
    "ray.tune.experiment.experiment": {"Experiment"},
    "ray.tune.experiment.trial": {"_TrainingRun", "Trial", "_Location"},
    "ray.tune.execution.placement_groups": {"PlacementGroupFactory"},
    "ray.tune.stopper.noop": {"NoopStopper"},
    "ray.train._internal.storage": {"StorageContext", "_FilesystemSyncer",
                                    "_upload_to_fs_path"},
    "ray.train._internal.checkpoint_manager": {"_CheckpointManager"},
    "ray.train._checkpoint": {"Checkpoint"},
    "ray.train.constants": set(),
    "ray.air.constants": set(),
    "wellfed.search.rungs": {"Rungs"},
    "wellfed.search.story": {"Story"},
    "wellfed.search.tune_callback": {"StoryCallback"},
}
"""(module, name) -> resolvable while a pickle of a search's Tune state is checked: what Ray
2.60's Tune, Optuna's TPE and this package put there (tuner.pkl, the searcher's state, the
trials' pickled fields). Code (a function or class pickled by value) is not among them."""


NOT_CALLED = {("ray.train._internal.storage", "_upload_to_fs_path")}
"""Names a search's state holds as a value (the syncer's upload function), never calls while it
is unpickled: the check refuses a pickle that calls one."""
LOCAL_ONLY = {("pyarrow._fs", "FileSystem._from_uri")}
"""Called with the URI of the search folder's filesystem: a local one (`file://`) only."""


class Refused(pickle.UnpicklingError):
    pass


class _NotCalled:
    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise Refused(f"it calls {self.name}, which a search's state only holds")


class _Checked(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name not in ALLOWED.get(module, ()):
            raise Refused(f"it names {module}.{name}, which a search's state never holds")
        if (module, name) in NOT_CALLED:
            return _NotCalled(f"{module}.{name}")
        found = super().find_class(module, name)
        if (module, name) in LOCAL_ONLY:
            def local(uri, *args, **kwargs):
                if not str(uri).startswith("file://"):
                    raise Refused(f"it opens {uri!r}: a search's state is on a local folder")
                return found(uri, *args, **kwargs)
            return local
        return found


def pickle_fault(data: bytes) -> str | None:
    """Why `data` is no pickle of a search's state (None: it is)."""
    try:
        _Checked(io.BytesIO(data)).load()
    except Refused as err:
        return str(err)
    except Exception as err:  # cut short, or not a pickle at all
        return f"it cannot be read ({type(err).__name__}: {err})"
    return None


def _fallbacks(value, found: list[bytes]) -> None:
    """The pickles Tune keeps inside its JSON (`CLOUDPICKLE_FALLBACK`, hex), at any depth (a
    trial's state is JSON in a string of the experiment's)."""
    if isinstance(value, dict):
        if value.get("_type") == "CLOUDPICKLE_FALLBACK" and isinstance(value.get("value"), str):
            found.append(bytes.fromhex(value["value"]))
            return
        for item in value.values():
            _fallbacks(item, found)
    elif isinstance(value, list):
        for item in value:
            _fallbacks(item, found)
    elif isinstance(value, str) and value[:1] in "{[":
        try:
            inner = json.loads(value)
        except ValueError:
            return
        _fallbacks(inner, found)


def fault(phase_dir: Path) -> str | None:
    """Why Ray Tune's saved state in `phase_dir` must not be restored (one clause naming the
    file), or None when every file in it is whole and holds only what a search's state holds.
    Tune restores a phase from its newest `experiment_state-*.json`: without one (a disk that
    filled before Ray's syncer copied it) its `Tuner.restore` succeeds, then its controller
    fails to read the run's state and starts the phase again on the restored searcher, which
    ends it short of its trials."""
    files = sorted(p for p in phase_dir.iterdir() if p.is_file())
    if (phase_dir / "tuner.pkl").is_file() and not any(
            p.name.startswith("experiment_state-") for p in files):
        return "it has tuner.pkl but no experiment_state-*.json (never copied whole)"
    for path in files:
        data = path.read_bytes()
        if not data:
            if path.name.startswith("."):
                continue  # Tune's empty markers (.validate_storage_marker)
            return f"{path.name} is empty (cut short before its first byte)"
        if data[:1] == b"\x80":  # a pickle, whatever its name (search_gen_state-*.json is one)
            why = pickle_fault(data)
            if why:
                return f"{path.name}: {why}"
            continue
        if path.suffix != ".json":
            continue
        try:
            state = json.loads(data)
        except ValueError as err:
            return f"{path.name} is not whole ({err.msg} at byte {err.pos} of {len(data)})"
        blobs: list[bytes] = []
        _fallbacks(state, blobs)
        for blob in blobs:
            if why := pickle_fault(blob):
                return f"{path.name} holds a pickle: {why}"
    return None


def set_aside(phase_dir: Path) -> Path:
    """Rename `phase_dir` to `<name>.damaged` (`.damaged-2`, ... when taken); the new name."""
    target = phase_dir.with_name(phase_dir.name + ".damaged")
    count = 1
    while target.exists():
        count += 1
        target = phase_dir.with_name(f"{phase_dir.name}.damaged-{count}")
    phase_dir.rename(target)
    return target
