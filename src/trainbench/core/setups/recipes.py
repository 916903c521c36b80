"""Optimizations as declarative changes to a training configuration.

A ``Recipe`` names the knobs it turns (``amp="fp16"``, ``num_workers=8`` ...), what the
device must offer for it to make sense (CUDA, a compute capability, several GPUs) and
how much extra warm-up it needs. Recipes compose, so the seeds' cumulative ladders are
lists of recipes. ``training.py`` is the one place where each knob takes effect; every other
rule about a knob is its entry in the knob table (``Knob``, in ``TrainConfig``'s fields), which
the other modules ask through ``TrainConfig.turned``.

Whether a recipe can run on a device, for a spec, is ``eligibility.why_not``'s answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainbench.core.setups import effects
from trainbench.core.setups.effects import DEBUG_NVTX, DEBUG_PROFILER, STAGES, Effect
from trainbench.core.setups.spec import NotApplicable, TrainingSpec  # noqa: F401 - NotApplicable: named where recipes are
from trainbench.core.setups.workloads import Profile

AMP_DTYPES = ("fp16", "bf16")
ZERO_GRAD_MODES = ("zeros", "set_to_none", "param_none")
OPTIMIZER_IMPLS = (None, "loop", "foreach", "fused")
DEBUG_MODES = (None, "anomaly", DEBUG_PROFILER, DEBUG_NVTX)
# Left-on debug APIs that run a profiler of their own (emit_nvtx is the autograd profiler in NVTX mode):
# no second profiler (a trace, the kernel count) can start beside them.
PROFILING_DEBUG_MODES = (DEBUG_PROFILER, DEBUG_NVTX)
LOSS_HISTORY_MODES = (None, "tensor", "detach", "item")
EVAL_MODES = (None, "autograd", "no_grad", "inference_mode")
SYNTHETIC_MODES = (None, "host", "device")
FUSE_MODES = (None, "script", "compile")
PARALLEL_MODES = (None, "dp", "ddp", "fsdp")
RANK_PARALLEL_MODES = ("ddp", "fsdp")  # one process per rank, launched by torchrun
SDPA_BACKENDS = (None, "math", "flash", "efficient")
CONV_BIAS_CHANGES = (None, "add", "remove")
# How the gradient guard measures a recipe's first-step gradients against its baseline's (trainbench.core.setups.guards):
# "parameter": the worst parameter's ||g - g_base|| / ||g_base||, for gradients equal by construction;
# "direction": 1 - the cosine of all the gradients taken as one vector, for reduced precision, where BatchNorm's
# backward (sums that cancel) leaves single parameters' gradients tens of percent off while the step keeps its way.
GRADIENT_MEASURES = ("parameter", "direction")


class ConfigError(ValueError):
    """Knobs that make no sense together, or an override that would cancel a recipe's knob."""


@dataclass(frozen=True)
class Knob:
    """What trainbench must know of one ``TrainConfig`` field besides how it takes effect (``training.py``): the one
    table of knob rules, read through ``TrainConfig.turned``. An entry applies while the knob is off its default: a
    string, tuple or True always, a mapping for the values it names, a callable where it says so for the config."""

    minimum: int | None = None  # an int >= this (validate)
    choices: tuple | None = None  # the values it takes (validate)
    data_path: bool = False  # how batches reach the step: a recipe turning it is judged on the loader (judging_overrides)
    spec_needs: str | None = None  # the TrainingSpec attribute it needs (SPEC_NEEDS says why; spec_unmet)
    custom_step: Any = None  # why a custom step (TrainingSpec.step) cannot take it (spec_unmet)
    build_needs: Any = None  # what the device or PyTorch build must have (names eligibility's BUILD_NEEDS knows)
    process_wide: str | None = None  # the process-wide setting it flips: not timed beside another setup (plan)
    fresh_process: str | None = None  # why a GPU measures it in a new process (device.CudaBackend)
    # (variable, accepted values; the first the default): the environment that fresh process starts with
    fresh_env: tuple[str, tuple[str, ...]] | None = None
    same_tensors: Any = False  # the step holds the device tensors it holds at the default (predict.memory_setup)
    unpredictable: Any = None  # why fake tensors cannot run it (predict.unpredictable)
    predicted_at_default: bool = False  # only shapes what an unpredictable knob starts: predicted at its default
    compiled: bool = False  # the model's code runs compiled (TorchScript, torch.compile), not op by op
    effect: Effect | None = None  # what it does to a training setup, stage by stage (trainbench.core.setups.effects)
    # what a failed gradient guard likely comes from, where the spec counts no items (guards.with_likely_cause)
    gradient_guard_cause: str | None = None
    recomputes: bool = False  # backward runs forwards again (a failure there may be the model's cache: execute)
    # why dispatch modes do not see the whole step (replicas in threads): no memory or work passes (method.passes)
    unseen_by_dispatch: Any = None
    shards_parameters: Any = False  # parameters and gradients are DTensor shards: FSDP2's memory tracker follows them


def knob(default: Any, **entries) -> Any:
    """A ``TrainConfig`` field with its ``Knob`` entries."""
    return field(default=default, metadata={"knob": Knob(**entries)})


def _wraps_the_forward(wrapper: str) -> str:
    return (f"a custom step calls its modules and optimizers itself; {wrapper} wraps the root module's forward, "
            "which the step need not call")


_COMPILED_CODE = "compiled code (torch.compile, TorchScript) runs its own kernels, which fake tensors cannot enter"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides how one training step runs. Defaults are the seeds' baseline."""

    # -- data path
    batch_size: int | None = None  # samples per optimizer step before batch_multiplier (None: the spec's)
    batch_multiplier: int = knob(1, minimum=1)  # a larger batch: the step trains batch_size x this many samples
    num_workers: int = knob(0, minimum=0, data_path=True, spec_needs="dataset", same_tensors=True, effect=effects.WORKERS)
    # with workers: a batch that takes longer fails the case (a hung dataset)
    loader_timeout_s: float = knob(300.0, same_tensors=True)
    pin_memory: bool = knob(False, data_path=True, spec_needs="dataset", same_tensors=True, effect=effects.PINNED)
    non_blocking: bool = knob(False, data_path=True, same_tensors=True)
    uint8_transfer: bool = knob(False, data_path=True, spec_needs="dataset", effect=effects.UINT8_PIXELS)  # copy uint8 pixels, normalize on the device
    # loader yields NHWC uint8; the device sees a channels-last view
    channels_last_input: bool = knob(False, data_path=True)
    # no loader: random batches made on the host and copied, or made on the device
    synthetic: str | None = knob(None, choices=SYNTHETIC_MODES, data_path=True, spec_needs="batches")
    # -- precision
    amp: str | None = knob(None, choices=(None,) + AMP_DTYPES, build_needs={"bf16": ("bf16",)}, effect=effects.AUTOCAST)  # "fp16" | "bf16"
    grad_scaler: bool = knob(False, effect=effects.GRAD_SCALER)
    # -- batch and memory
    # the step's batch split into this many loader micro-batches
    accumulation_steps: int = knob(1, minimum=1, effect=effects.ACCUMULATION, gradient_guard_cause=(
        "the micro-batch losses are averaged equally (loss / k), which gives the whole batch's gradients only if "
        "loss_fn is a mean over samples; a mean over a count that differs between micro-batches (non-padding "
        "tokens) needs TrainingSpec.items, so each is weighted by its count"), custom_step="a custom step interleaves its updates with its forwards: "
                                   "accumulating micro-batches would reorder them")
    # recompute the spec's checkpoint blocks in backward instead of saving activations
    checkpointing: bool = knob(False, spec_needs="checkpoint_blocks", effect=effects.CHECKPOINTING, recomputes=True)
    # The seeds' baseline calls ``optimizer.zero_grad()`` meaning "write zeros"; PyTorch 2
    # changed the default to set_to_none=True, so the baseline asks for zeros explicitly.
    zero_grad: str = knob("zeros", choices=ZERO_GRAD_MODES, effect=effects.ZERO_GRAD)  # "zeros" | "set_to_none" | "param_none" (param.grad = None)
    # running loss kept as: "tensor" (the leak), "detach", "item"; "item" every step keeps a float on the host, no
    # device sum between steps
    loss_history: str | None = knob(None, choices=LOSS_HISTORY_MODES, effect=effects.LOSS_HISTORY,
                                    same_tensors=lambda config: config.loss_history == "item" and config.log_every == 1)
    log_every: int = knob(1, minimum=1)  # with loss_history="item": one .item() (a host sync) every N steps
    # evaluation step instead of training: "autograd" | "no_grad" | "inference_mode"
    eval_mode: str | None = knob(None, choices=EVAL_MODES, effect=effects.EVALUATION, custom_step="a custom step is a training step: evaluation "
                                 "measures a loss_fn's forward, which the spec does not state")
    # release cached allocator blocks after every step (on the allocator, not on tensors)
    empty_cache: bool = knob(False, process_wide="the caching allocator's cache", same_tensors=True, effect=effects.EMPTY_CACHE)
    # -- compute
    compile: bool = knob(False, unpredictable=_COMPILED_CODE, compiled=True, effect=effects.COMPILE)
    cudnn_benchmark: bool = knob(False, process_wide="torch.backends.cudnn.benchmark", same_tensors=True, effect=effects.CUDNN_BENCHMARK, fresh_process=(
        "cuDNN's plan cache lives as long as the process and its key ignores the benchmark flag: after any earlier "
        "convolution the autotuner would not run, and the ratio would be ~1.0"))
    channels_last: bool = knob(False, effect=effects.CHANNELS_LAST)
    # The biases of convolutions followed by a norm that cancels them (training.convs_before_norms): None leaves the
    # model as built; "add" gives the bias-free ones a zero bias (the seeds' "with bias"); "remove" removes theirs.
    conv_bias: str | None = knob(None, choices=CONV_BIAS_CHANGES, effect=effects.CONV_BIAS)
    # the model's ``pointwise`` functions: "script" | "compile"
    fuse_pointwise: str | None = knob(None, choices=FUSE_MODES, unpredictable=_COMPILED_CODE, compiled=True, effect=effects.FUSE_POINTWISE)
    # scaled_dot_product_attention restricted to "math" | "flash" | "efficient"
    sdpa_backend: str | None = knob(None, choices=SDPA_BACKENDS, effect=effects.SDPA)
    optimizer_impl: str | None = knob(None, choices=OPTIMIZER_IMPLS)  # None: PyTorch's default; "loop" | "foreach" | "fused"
    # left-on debug API: "anomaly" | "profiler" | "emit_nvtx"; NVTX ranges hold no tensor (and a CPU cannot fake them)
    debug: str | None = knob(None, choices=DEBUG_MODES, process_wide="autograd's anomaly mode or profiler", effect=effects.DEBUG,
                             same_tensors={DEBUG_NVTX: True}, unpredictable={
                                 "anomaly": "anomaly mode checks every gradient for NaN: a data-dependent test fake "
                                            "tensors cannot answer",
                                 DEBUG_PROFILER: "the profiler records real kernels, none of which run under fake tensors"})
    # torch.use_deterministic_algorithms(True)
    deterministic: bool = knob(False, process_wide="torch.use_deterministic_algorithms", effect=effects.DETERMINISTIC, fresh_process=(
        "cuBLAS reads CUBLAS_WORKSPACE_CONFIG (needed for deterministic matmuls) once, when it starts"),
        fresh_env=("CUBLAS_WORKSPACE_CONFIG", (":4096:8", ":16:8")))  # the two settings PyTorch documents as deterministic
    # -- scale
    # "dp": nn.DataParallel over the GPUs; "ddp": DistributedDataParallel, one process per rank; "fsdp": FSDP2
    # (torch.distributed.fsdp.fully_shard: parameters, gradients and optimizer state sharded over the ranks)
    parallel: str | None = knob(
        None, choices=PARALLEL_MODES, effect=effects.DATA_PARALLEL, shards_parameters={"fsdp": True},
        unseen_by_dispatch={"dp": "DataParallel: no memory breakdown, growth, FLOP or op counts (replica threads are "
                                  "invisible to dispatch modes); allocator peaks are the first GPU's"},
        build_needs={"ddp": ("torch.distributed",), "fsdp": ("torch.distributed", "fully_shard")},
        unpredictable="data parallelism runs replicas in other threads or processes, outside the fake mode",
        custom_step={"dp": _wraps_the_forward("DataParallel"), "ddp": _wraps_the_forward("DistributedDataParallel"),
                     "fsdp": _wraps_the_forward("FSDP2")})
    # processes under "ddp"/"fsdp" (batch_size is per process)
    world_size: int = knob(1, minimum=1, predicted_at_default=True)
    replicas: int = knob(1, minimum=1, predicted_at_default=True)  # GPUs under "dp": the one process's batch is scattered
    # "gloo" | "nccl" (None: nccl on CUDA, gloo on the CPU)
    dist_backend: str | None = knob(None, choices=(None, "gloo", "nccl"), predicted_at_default=True)
    seed: int = 0
    # Users' own knobs (``register_knob``) off their defaults, as sorted (name, value) pairs: hashable, and absent
    # from a config that turns none, so records of built-in recipes read as before.
    user_knobs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, **values) -> TrainConfig:
        """A config from knob values, built-in or users' (``register_knob``), by name."""
        unknown = set(values) - known_knobs()
        if unknown:
            raise ConfigError(f"unknown knobs {sorted(unknown)}; known: {sorted(known_knobs())}")
        own = {k: v for k, v in values.items() if k in USER_KNOBS}
        user = tuple(sorted((k, v) for k, v in own.items() if v != USER_KNOBS[k][1]))
        return cls(**{k: v for k, v in values.items() if k not in USER_KNOBS}, user_knobs=user)

    def replaced(self, **values) -> TrainConfig:
        """This config with ``values`` (built-in or users' knobs) in place of its own."""
        return TrainConfig.of(**{**self.record(), **values})

    def value(self, name: str) -> Any:
        """A knob's value, built-in or a user's."""
        if name in KNOBS:
            return getattr(self, name)
        return dict(self.user_knobs).get(name, USER_KNOBS[name][1])

    def record(self) -> dict[str, Any]:
        """The config as a saved record and a child process read it: every built-in knob, and each user knob turned."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "user_knobs"}
        return {**fields, **dict(self.user_knobs)}

    def effects(self, stage: str) -> list[tuple[str, Any, Any]]:
        """(knob, value, hook) for each knob whose effect acts at ``stage`` (``effects.STAGES``) in this config: turned
        off its default (or acting at it, ``Effect.at_default``), in the table's order, users' knobs last."""
        found = []
        for name, entry in self._entries():
            hook = getattr(entry.effect, stage, None) if entry.effect is not None else None
            value = self.value(name)
            if hook is not None and (value != self._default(name) or entry.effect.at_default):
                found.append((name, value, hook))
        return found

    def _entries(self):
        yield from KNOBS.items()
        for name, (entry, _) in USER_KNOBS.items():
            yield name, entry

    @staticmethod
    def _default(name: str) -> Any:
        return _DEFAULTS[name] if name in _DEFAULTS else USER_KNOBS[name][1]

    @property
    def trains(self) -> bool:
        """A training step (forward, backward, update), not an evaluation forward (``eval_mode``)."""
        return self.eval_mode is None

    @property
    def compiles(self) -> bool:
        """Whether torch.compile builds kernels for this setup (Triton on a GPU, C++ on the CPU)."""
        return self.compile or self.fuse_pointwise == "compile"

    def validate(self) -> TrainConfig:
        """Knob values and combinations that make sense whatever the spec (``spec_unmet`` checks the spec's side)."""
        if self.batch_size is not None and (isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int)
                                            or self.batch_size < 1):
            raise ConfigError(f"batch_size must be a positive int, got {self.batch_size!r}")
        for name, entries in self._entries():
            value = self.value(name)
            if entries.minimum is not None and (not isinstance(value, int) or value < entries.minimum):
                raise ConfigError(f"{name} must be an int >= {entries.minimum}, got {value!r}")
            if entries.choices is not None and value not in entries.choices:
                raise ConfigError(f"{name} must be one of {entries.choices}, got {value!r}")
        if isinstance(self.loader_timeout_s, bool) or not isinstance(self.loader_timeout_s, (int, float)) \
                or not self.loader_timeout_s > 0:
            raise ConfigError(f"loader_timeout_s must be a number of seconds > 0, got {self.loader_timeout_s!r}")
        if self.grad_scaler and self.amp is None:
            raise ConfigError("grad_scaler=True needs amp set: gradient scaling only exists for mixed precision")
        if self.channels_last_input and not self.uint8_transfer:
            raise ConfigError("channels_last_input needs uint8_transfer: the NHWC batch is normalized on the device")
        if self.eval_mode and (self.accumulation_steps > 1 or self.loss_history == "tensor" or self.grad_scaler):
            raise ConfigError("eval_mode runs forward only: no accumulation, GradScaler or graph-keeping loss history")
        if self.synthetic and any(need == "dataset" for _, need in self.turned("spec_needs")):
            raise ConfigError("synthetic batches bypass the DataLoader: loader knobs (workers, pinning, uint8) do not apply")
        if (self.world_size > 1) != self.rank_processes:
            raise ConfigError(f"world_size > 1 goes with parallel='ddp' or 'fsdp' (one process per rank); got "
                             f"parallel={self.parallel!r}, world_size={self.world_size}")
        if (self.replicas > 1) != (self.parallel == "dp"):
            raise ConfigError(f"replicas > 1 goes with parallel='dp' (one process, several GPUs); got "
                             f"parallel={self.parallel!r}, replicas={self.replicas}")
        return self

    def turned(self, entry: str) -> list[tuple[str, Any]]:
        """(knob, what its ``Knob`` ``entry`` says) for each knob off its default where that entry applies, in field
        order: e.g. ``turned("unpredictable")`` gives each knob fake tensors cannot run, with why."""
        found = []
        for name, entries in self._entries():
            value = self.value(name)
            if value == self._default(name):
                continue
            said = getattr(entries, entry)
            said = said.get(value) if isinstance(said, Mapping) else said(self) if callable(said) else said
            if said:
                found.append((name, said))
        return found

    def with_defaults(self, *entries: str) -> TrainConfig:
        """This config with every knob that ``turned`` finds under one of ``entries`` back at its default."""
        return self.replaced(**{name: self._default(name) for entry in entries for name, _ in self.turned(entry)})

    @property
    def runs_compiled_code(self) -> bool:
        """The model's code runs compiled (TorchScript, torch.compile): its launches are not eager dispatch's."""
        return bool(self.turned("compiled"))

    @property
    def runs_a_profiler(self) -> bool:
        """The setup's left-on debug API runs a profiler, so no other profiler can start while it trains."""
        return self.debug in PROFILING_DEBUG_MODES

    @property
    def rank_processes(self) -> bool:
        """Trained by ``world_size`` rank processes in a process group (DDP, FSDP2), not in this process."""
        return self.parallel in RANK_PARALLEL_MODES

    @property
    def shards(self) -> int:
        """Into how many devices' shares one step's batch is split: its ranks (DDP, FSDP) or DataParallel replicas."""
        return self.world_size if self.rank_processes else self.replicas

    def one_process_equivalent(self, shards: int | None = None) -> TrainConfig:
        """The same training in one process on one device, as data parallelism computes it: the global batch, each
        device's share a micro-batch of its own (``shards`` of them; default this config's own shards).

        DDP's gradients are the mean of the ranks' gradients, each over its own samples (DataParallel's replicas
        likewise): accumulating the shards as micro-batches (loss / k) gives exactly that, BatchNorm's statistics
        per shard included, where one pass over the whole batch normalizes over all of it. A one-process baseline
        judged against ranks is split into theirs (``shards``). The shards are the same samples the ranks take:
        ``RankSampler`` and ``SyntheticBatches`` slice one global batch, DataParallel scatters it in order."""
        shards = shards or self.shards
        global_batch = self.world_size if self.rank_processes else 1  # a rank's batch_size is per process
        if shards == 1 and not self.parallel:
            return self
        return dataclasses.replace(self, parallel=None, world_size=1, replicas=1, dist_backend=None,
                                   batch_multiplier=self.batch_multiplier * global_batch,
                                   accumulation_steps=self.accumulation_steps * shards)

    def step_batch_size(self, spec: TrainingSpec) -> int:
        """Samples per optimizer step in one process."""
        return (self.batch_size if self.batch_size is not None else spec.batch_size) * self.batch_multiplier

    def loader_batch_size(self, spec: TrainingSpec) -> int:
        """Samples per loader batch: the step's batch, or one micro-batch of it under accumulation."""
        step, k = self.step_batch_size(spec), self.accumulation_steps
        if step % k:
            raise ConfigError(f"a batch of {step} does not split into {k} equal micro-batches")
        return step // k

    @property
    def pixels(self) -> str | None:
        """The pixel format the dataset serves (None: the spec's own, float)."""
        return ("uint8_hwc" if self.channels_last_input else "uint8") if self.uint8_transfer else None


KNOBS: dict[str, Knob] = {f.name: f.metadata.get("knob", Knob()) for f in dataclasses.fields(TrainConfig)
                          if f.name != "user_knobs"}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
# Users' knobs (register_knob): name -> (entry, default). Read by TrainConfig as the built-in table is.
USER_KNOBS: dict[str, tuple[Knob, Any]] = {}


def known_knobs() -> set[str]:
    """Every knob a recipe may turn: the built-in table's, ``batch_size`` and ``seed``, and users' own."""
    return set(_DEFAULTS) - {"user_knobs"} | set(USER_KNOBS)


@dataclass(frozen=True)
class ByProfile:
    """A knob value that depends on the device profile, e.g. batch 64 on CPU, 512 on GPU."""

    cpu: Any
    gpu: Any

    def pick(self, profile: Profile) -> Any:
        return getattr(self, profile.name)


@dataclass(frozen=True)
class Requirements:
    """What a device must offer for a recipe to be meaningful there (``eligibility.why_not`` checks it)."""

    cuda: bool = False
    min_capability: tuple[int, int] | None = None  # implies CUDA
    gpu_capability: tuple[int, int] | None = None  # on a GPU at least this; any CPU is fine
    min_gpus: int = 0
    bf16: bool = False
    cpu_only: bool = False  # a CPU-side stand-in for a GPU case (e.g. DDP over gloo)
    gpu_variant: str | None = None  # with cpu_only: the recipe that measures the same on GPUs (e.g. ddp)

    @property
    def needs_cuda(self) -> bool:
        return bool(self.cuda or self.min_capability or self.min_gpus)

    def merge(self, other: Requirements) -> Requirements:
        def highest(a, b):
            found = [c for c in (a, b) if c]
            return max(found) if found else None

        return Requirements(
            cuda=self.cuda or other.cuda,
            min_capability=highest(self.min_capability, other.min_capability),
            gpu_capability=highest(self.gpu_capability, other.gpu_capability),
            min_gpus=max(self.min_gpus, other.min_gpus),
            bf16=self.bf16 or other.bf16,
            cpu_only=self.cpu_only or other.cpu_only,
            gpu_variant=self.gpu_variant or other.gpu_variant,
        )


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    changes: Mapping[str, Any] = field(default_factory=dict)
    requires: Requirements = Requirements()
    # What the recipe is measured against: its ratio budgets and its guards compare to this
    # recipe on the same workload in the same session ("baseline", or e.g. "optimizer_loop").
    baseline: str = "baseline"
    extra_warmup_steps: int = 0  # compile and autotuning need longer to reach steady state
    slow: bool = False
    # Correctness guards (trainbench.core.setups.guards) against ``baseline``: largest relative loss
    # difference over a few seeded steps, and largest relative first-step gradient error.
    # None: not guarded, the recipe changes what is trained by design (say why in the description).
    loss_rtol: float | None = None
    grad_rtol: float | None = None
    grad_measure: str = "parameter"  # what grad_rtol bounds: one of GRADIENT_MEASURES
    reference: bool = False  # a starting point other recipes are measured against, not an optimization
    # The built-in workloads the suite measures it on, in any order (``cases.SUITE`` reads them: workloads in their
    # table's order, each one's recipes in this table's).
    suite: tuple[str, ...] = ()

    def __post_init__(self):
        if self.grad_measure not in GRADIENT_MEASURES:
            raise ConfigError(f"recipe {self.name!r}: grad_measure must be one of {GRADIENT_MEASURES}, "
                              f"got {self.grad_measure!r}")
        unknown = set(self.changes) - known_knobs()
        if unknown:
            raise ConfigError(f"recipe {self.name!r} changes unknown knobs {sorted(unknown)}; known: {sorted(known_knobs())}")

    def changes_for(self, profile: Profile) -> dict[str, Any]:
        return {k: (v.pick(profile) if isinstance(v, ByProfile) else v) for k, v in self.changes.items()}

    def config(self, profile: Profile, base: TrainConfig | None = None, **overrides) -> TrainConfig:
        """The training config this recipe gives on ``profile``, starting from ``base``, with ``overrides``.

        An override composes with the recipe (``batch_size`` sets the batch that ``larger_batch``
        multiplies); one that would cancel a knob the recipe turns is an error, never silent.
        """
        unknown = set(overrides) - known_knobs()
        if unknown:
            raise ConfigError(f"unknown override {sorted(unknown)}; known knobs: {sorted(known_knobs())}")
        values = self.changes_for(profile)
        for key, value in overrides.items():
            if key in values and values[key] != value:
                raise ConfigError(f"the override {key}={value!r} would cancel recipe {self.name!r}'s {key}={values[key]!r}; "
                                 "drop the override, or state that value in the spec or a recipe of your own")
        values.update(overrides)
        return (base or TrainConfig()).replaced(**values).validate()


# The optimizer arguments each implementation choice passes (both, so a spec's own foreach/fused is overridden).
OPTIMIZER_IMPL_KWARGS = {"loop": {"foreach": False, "fused": False}, "foreach": {"foreach": True, "fused": False},
                         "fused": {"fused": True, "foreach": False}}


# What a spec must provide for the knobs that need it (``Knob.spec_needs``), in the order ``spec_unmet`` asks.
SPEC_NEEDS = {"checkpoint_blocks": "the spec names no checkpoint_blocks to recompute",
              "dataset": "the spec has no dataset (worker processes, pinned memory and uint8 pixels feed a DataLoader)",
              "batches": "the spec has no batches factory to make synthetic batches with"}


def spec_unmet(spec: TrainingSpec, config: TrainConfig) -> str | None:
    """What ``spec`` lacks for ``config``'s knobs, or None (what only the built model tells is checked by training.py)."""
    if config.pixels and config.pixels not in spec.pixels:
        return f"the spec's dataset serves no {config.pixels} pixels (TrainingSpec.pixels names {list(spec.pixels)})"
    needed = {need for _, need in config.turned("spec_needs")}
    for need, why in SPEC_NEEDS.items():
        given = getattr(spec, need)
        if need in needed and (given is None or not callable(given) and not given):  # a factory, or names (maybe none)
            return why
    if spec.custom_step:  # what a custom step (TrainingSpec.step) cannot do for the knobs
        for _, why in config.turned("custom_step"):
            return why
    for argument in OPTIMIZER_IMPL_KWARGS.get(config.optimizer_impl, {}):
        if spec.optimizer_accepts(argument) is False:  # None: optimizers(model) tells once built (training.py)
            return (f"the spec's optimizer factory takes no {argument}= argument "
                    "(give the class with its arguments, e.g. functools.partial(torch.optim.AdamW, lr=1e-3))")
    return None


# The knobs of the data path: recipes turning one are measured with the loader as the seeds ran it.
DATA_PATH_KNOBS = tuple(name for name, entries in KNOBS.items() if entries.data_path)


def judging_overrides(recipe: Recipe, baseline: Recipe, profile: Profile, spec: TrainingSpec,
                      overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Knobs a case and its baseline both get so that their ratio measures the recipe, not the loader.

    On a GPU the seeds' baseline waits on image decoding in the main process (~38 ms a batch
    against a ~10 ms step on an H100), so a compute recipe (AMP, channels-last, autotuning...)
    judged against it measures ~1.0x whatever it does. Compute recipes are judged with both
    sides on device-side synthetic batches (``Profile.compute_data``); data-path recipes, and
    specs without a batch factory, keep the loader. DDP against DataParallel is a compute
    comparison too: on the loader, one DataParallel process decodes the global batch while each
    rank decodes its share in parallel (each rank makes its slice of the synthetic global batch).
    """
    if profile.compute_data is None or "synthetic" in overrides:
        return {}
    if any(knob in r.changes for r in (recipe, baseline) for knob in DATA_PATH_KNOBS) or any(
            overrides.get(knob) for knob in DATA_PATH_KNOBS):  # a loader the caller asked for stays
        return {}
    extra = {"synthetic": profile.compute_data}
    if any(spec_unmet(spec, r.config(profile, **overrides, **extra)) for r in (recipe, baseline)):
        return {}
    return extra


def compose(name: str, *recipes: Recipe, description: str | None = None, baseline: str = "baseline") -> Recipe:
    """One recipe applying ``recipes`` in order (later ones win on the same knob)."""
    changes: dict[str, Any] = {}
    requires = Requirements()
    for r in recipes:
        changes.update(r.changes)
        requires = requires.merge(r.requires)

    def loosest(values):
        return None if any(v is None for v in values) else max(values)

    return Recipe(
        name=name,
        description=description or " + ".join(r.name for r in recipes),
        changes=changes,
        requires=requires,
        baseline=baseline,
        extra_warmup_steps=max((r.extra_warmup_steps for r in recipes), default=0),
        slow=any(r.slow for r in recipes),
        loss_rtol=loosest([r.loss_rtol for r in recipes]) if recipes else 0.0,
        grad_rtol=None,
    )


BASELINE = Recipe("baseline", "the seeds' starting point: fp32, one process, pageable float32 copies, zero_grad() writing zeros",
                  reference=True, suite=("resnet18", "convnet", "transformer", "gelu_mlp", "gpt", "vit"))
_GPU = Requirements(cuda=True)
_TENSOR_CORES = Requirements(cuda=True, min_capability=(7, 0))
_TWO_GPUS = Requirements(cuda=True, min_gpus=2)
# Mixed precision where the device has it: bf16 on CPUs (no fast fp16 kernels), fp16 on tensor cores.
_AMP = {"amp": ByProfile(cpu="bf16", gpu="fp16")}
# The fused attention kernels of GPUs take half precision only; CPU kernels take fp32.
_SDPA_AMP = {"amp": ByProfile(cpu=None, gpu="bf16")}

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        BASELINE,
        # -- data path ---------------------------------------------------------------
        Recipe(
            "multiprocess_loading",
            "DataLoader worker processes (2 on the CPU profile, the seeds' 8 on GPU)",
            {"num_workers": ByProfile(cpu=2, gpu=8)},
            loss_rtol=1e-6,  # the sampler runs in the main process: same batches, same order
            suite=("resnet18",),
        ),
        Recipe("pinned_memory", "page-locked host batches and non_blocking copies that overlap compute",
               {"pin_memory": True, "non_blocking": True}, _GPU, loss_rtol=1e-6, suite=("resnet18",)),
        Recipe(
            "uint8_transfer",
            "copy uint8 pixels and normalize on the device: 4x fewer bytes to the device",
            {"uint8_transfer": True},
            loss_rtol=1e-6,  # the same normalization, on the device: bit-identical on CPU
            suite=("resnet18",),
        ),
        Recipe(
            "channels_last_input",
            "loader keeps the images' HWC layout (no transpose per image); the device sees NHWC as channels-last NCHW",
            {"uint8_transfer": True, "channels_last_input": True},
            baseline="uint8_transfer",
            loss_rtol=1e-3,  # convolutions on channels-last inputs sum in another order
            suite=("resnet18",),
        ),
        Recipe("host_tensors", "synthetic batches made on the host, then copied: torch.rand(...).to(device)",
               {"synthetic": "host"}, reference=True),
        Recipe(
            "device_tensors",
            "synthetic batches constructed directly on the device: torch.rand(..., device=device). "
            "Unguarded: a device generator draws other random numbers than the host's",
            {"synthetic": "device"},
            baseline="host_tensors",
            suite=("resnet18",),
        ),
        # -- precision ---------------------------------------------------------------
        Recipe(
            "amp_bf16",
            "autocast to bfloat16 (no GradScaler needed: bf16 keeps fp32's exponent range)",
            {"amp": "bf16"},
            Requirements(bf16=True),
            # bf16 keeps 8 mantissa bits; measured 0.0063 on ResNet-18 over 4 steps. No gradient guard:
            # BatchNorm bias gradients are sums that cancel, and differ by ~40% in bf16 from step one.
            loss_rtol=0.03,
            suite=("resnet18", "transformer", "gpt", "vit"),
        ),
        Recipe(
            "amp_fp16",
            "autocast to float16 with a GradScaler (tensor cores on GPU)",
            {"amp": "fp16", "grad_scaler": True},
            # fp16 pays off on tensor cores; CPUs have no fast fp16 kernels (a step is ~30x slower here).
            _TENSOR_CORES,
            loss_rtol=0.01,
            # The step's direction: on ResNet-18 at 224 px, batch 32, fp16 autocast on a CPU (no GPU measured yet)
            # left BatchNorm parameters' gradients up to 19% off one by one, all of them 0.2% off in direction.
            grad_rtol=0.01,
            grad_measure="direction",
            suite=("resnet18", "transformer"),
        ),
        Recipe(
            "amp_fp16_no_scaler",
            "autocast to float16 without a GradScaler, as the articles run it: small gradients can underflow to zero; "
            "the gradient guard measures how far the unscaled fp16 gradients turn the step",
            {"amp": "fp16"},
            _TENSOR_CORES,
            loss_rtol=0.01,
            grad_rtol=0.01,  # as amp_fp16's; the same CPU estimate: 0.23% off in direction, 26% for one parameter
            grad_measure="direction",
            suite=("resnet18",),
        ),
        # -- batch -------------------------------------------------------------------
        Recipe("larger_batch", "4x the batch on CPU, 16x on GPU (the seeds' 512). Unguarded: another batch trains differently",
               {"batch_multiplier": ByProfile(cpu=4, gpu=16)}, suite=("resnet18", "transformer", "gpt", "vit")),
        Recipe(
            "grad_accumulation",
            "the larger batch as 4 accumulated micro-batches (loss / 4 each): the micro-batch's memory, "
            "the large batch's gradients (not with BatchNorm, whose statistics are per micro-batch)",
            {"batch_multiplier": ByProfile(cpu=4, gpu=16), "accumulation_steps": 4},
            baseline="larger_batch",
            loss_rtol=1e-5,
            grad_rtol=1e-4,  # fp32 sums in another order
            suite=("transformer", "gpt"),
        ),
        # -- memory ------------------------------------------------------------------
        Recipe(
            "checkpointing",
            "gradient checkpointing of the model's blocks: activations recomputed in backward",
            {"checkpointing": True},
            loss_rtol=1e-6,
            grad_rtol=1e-5,  # the recomputation repeats the same kernels
            suite=("resnet18", "transformer", "gpt", "vit"),
        ),
        Recipe("set_to_none", "zero_grad(set_to_none=True): free gradients instead of writing zeros",
               {"zero_grad": "set_to_none"}, loss_rtol=1e-6, suite=("resnet18", "transformer")),
        Recipe("param_grad_none", "`for p in model.parameters(): p.grad = None` instead of zero_grad()",
               {"zero_grad": "param_none"}, loss_rtol=1e-6, suite=("resnet18",)),
        Recipe("loss_leak", "`total_loss += loss` each step: every step's autograd graph stays alive (the anti-pattern)",
               {"loss_history": "tensor"}, reference=True),
        Recipe("loss_detach", "`total_loss += loss.detach()`: the running loss without the graph, and without a sync",
               {"loss_history": "detach"}, baseline="loss_leak", loss_rtol=1e-6, suite=("resnet18",)),
        Recipe("eval_autograd", "evaluation forward with autograd on: activations kept for a backward that never comes",
               {"eval_mode": "autograd"}, reference=True),
        Recipe("eval_no_grad", "evaluation under torch.no_grad()", {"eval_mode": "no_grad"},
               baseline="eval_autograd", loss_rtol=1e-6, suite=("resnet18",)),
        Recipe("eval_inference_mode", "evaluation under torch.inference_mode(): no autograd, no version counters",
               {"eval_mode": "inference_mode"}, baseline="eval_no_grad", loss_rtol=1e-6, suite=("resnet18", "transformer")),
        Recipe("empty_cache", "the CUDA caching allocator emptied after every step: lower reserved memory, paid in cudaMalloc",
               {"empty_cache": True}, _GPU, loss_rtol=1e-6, suite=("resnet18",)),
        # -- compute -----------------------------------------------------------------
        Recipe(
            "compile",
            "torch.compile of the model (compile time is reported as first_step_s, apart from steady state)",
            {"compile": True},
            extra_warmup_steps=10,
            slow=True,
            loss_rtol=1e-3,  # fused kernels round differently
            suite=("resnet18", "gpt"),
        ),
        Recipe("cudnn_benchmark", "cuDNN autotuner picks the fastest convolution algorithms", {"cudnn_benchmark": True},
               _GPU, extra_warmup_steps=5, loss_rtol=1e-3, suite=("resnet18",)),
        Recipe("channels_last", "NHWC memory format for the model and its inputs", {"channels_last": True},
               loss_rtol=1e-3, suite=("resnet18",)),  # NHWC kernels sum in another order: measured 2.7e-5
        Recipe("channels_last_amp", "channels-last model and inputs with mixed precision (bf16 on CPU, fp16 on GPU)",
               {"channels_last": True, **_AMP, "grad_scaler": ByProfile(cpu=False, gpu=True)}, loss_rtol=0.03, suite=("resnet18",)),
        Recipe("fuse_pointwise_script", "the GELU block under torch.jit.script: the fuser makes one CUDA kernel of it",
               {"fuse_pointwise": "script"}, _GPU, loss_rtol=1e-5, suite=("gelu_mlp",)),
        Recipe("fuse_pointwise_compile", "the GELU block under torch.compile: one generated kernel per direction",
               {"fuse_pointwise": "compile"}, extra_warmup_steps=2, loss_rtol=1e-5, suite=("gelu_mlp",)),
        Recipe("sdpa_math", "scaled_dot_product_attention restricted to the math kernel: the attention matrix materialized "
               "(bf16 autocast on GPU, as the fused kernels need)", {"sdpa_backend": "math", **_SDPA_AMP},
               reference=True),
        Recipe("sdpa_flash", "scaled_dot_product_attention restricted to FlashAttention (vs math): no attention matrix kept",
               {"sdpa_backend": "flash", **_SDPA_AMP}, Requirements(gpu_capability=(8, 0)), baseline="sdpa_math",
               loss_rtol=1e-3, suite=("gpt",)),  # another summation order
        Recipe("sdpa_efficient", "scaled_dot_product_attention restricted to the memory-efficient kernel (vs math)",
               {"sdpa_backend": "efficient", **_SDPA_AMP}, _GPU, baseline="sdpa_math", loss_rtol=1e-3, suite=("gpt",)),
        # A bias before a norm that subtracts each channel's mean (BatchNorm, InstanceNorm in training; GroupNorm with
        # a channel per group) is cancelled: removing it keeps the function; the loss guard checks the training does.
        Recipe("no_conv_bias", "the biases of the model's convolutions followed by a norm that cancels them removed, vs the "
               "model as given: fewer parameters and ops, the same training (skipped where they have none)",
               {"conv_bias": "remove"}, loss_rtol=1e-4, suite=("convnet",)),
        Recipe("conv_bias", "a zero bias added to each bias-free convolution followed by a norm that cancels it: the "
               "seeds' redundant bias, for models built without it", {"conv_bias": "add"}, reference=True),
        Recipe("conv_bias_free", "the model's bias-free convolutions before their norms as given (torchvision's ResNet), "
               "vs conv_bias's redundant biases: the seeds' comparison, what leaving the bias out saves",
               {}, baseline="conv_bias", loss_rtol=1e-4, suite=("resnet18",)),
        Recipe("optimizer_loop", "the optimizer updating one parameter at a time (foreach=False)",
               {"optimizer_impl": "loop"}, reference=True),
        Recipe("optimizer_foreach", "the optimizer with foreach=True: one multi-tensor kernel per update op",
               {"optimizer_impl": "foreach"}, baseline="optimizer_loop", loss_rtol=1e-5, suite=("resnet18", "transformer", "gpt")),
        Recipe("optimizer_fused", "the optimizer with fused=True: the whole update in one kernel",
               {"optimizer_impl": "fused"}, baseline="optimizer_loop", loss_rtol=1e-5, suite=("resnet18", "gpt")),
        Recipe("anomaly_detection", "torch.autograd.detect_anomaly left on: the cost of a debug API in training",
               {"debug": "anomaly"}, loss_rtol=1e-6, suite=("resnet18",)),
        Recipe("profiler_left_on", "torch.profiler (shapes, memory, stacks) left on across steps: its cost",
               {"debug": DEBUG_PROFILER}, loss_rtol=1e-6, suite=("resnet18",)),
        Recipe("emit_nvtx", "torch.autograd.profiler.emit_nvtx left on: NVTX ranges around every op",
               {"debug": DEBUG_NVTX}, _GPU, loss_rtol=1e-6, suite=("resnet18",)),
        Recipe("deterministic", "torch.use_deterministic_algorithms(True): the cost of reproducible kernels",
               {"deterministic": True}, loss_rtol=1e-3, suite=("resnet18",)),
        Recipe("loss_item", "`loss.item()` every step for logging: a host-device sync per step",
               {"loss_history": "item"}, reference=True),
        Recipe("loss_item_every_n", "losses summed on the device, `.item()` once every 10 steps (50 on GPU)",
               {"loss_history": "item", "log_every": ByProfile(cpu=10, gpu=50)}, baseline="loss_item", loss_rtol=1e-6, suite=("resnet18",)),
        # -- scale -------------------------------------------------------------------
        Recipe("one_process", "the global batch of two ranks in one process (twice the spec's batch)",
               {"batch_multiplier": 2}, reference=True),
        Recipe(
            "ddp_gloo",
            "DistributedDataParallel over gloo: 2 processes on the CPU, each half the batch on half the cores; "
            "gradients all-reduced to the one-process gradients",
            {"parallel": "ddp", "world_size": 2, "dist_backend": "gloo"},
            Requirements(cpu_only=True, gpu_variant="ddp"),
            baseline="one_process",
            grad_rtol=1e-4,  # the all-reduce averages two half-batch means: fp32 sums in another order
            suite=("transformer",),
        ),
        Recipe(
            "fsdp_gloo",
            "FSDP2 (fully_shard per block, then the model) over gloo: 2 CPU processes as ddp_gloo, each holding half of "
            "the parameters, gradients and optimizer state between steps",
            {"parallel": "fsdp", "world_size": 2, "dist_backend": "gloo"},
            Requirements(cpu_only=True, gpu_variant="fsdp"),
            baseline="ddp_gloo",
            grad_rtol=1e-4,  # the reduce-scatter sums the two half-batch gradients in another order than the all-reduce
            suite=("transformer",),
        ),
        Recipe("data_parallel", "nn.DataParallel: one process scatters twice the spec's batch over 2 GPUs",
               {"parallel": "dp", "replicas": 2, "batch_multiplier": 2}, _TWO_GPUS, reference=True),
        Recipe("ddp", "DistributedDataParallel over NCCL: one process per GPU, the spec's batch each (vs DataParallel)",
               {"parallel": "ddp", "world_size": 2, "dist_backend": "nccl"}, _TWO_GPUS, baseline="data_parallel",
               # against the one-process equivalent (per-GPU BatchNorm statistics, as both compute them): fp32 sums
               # in another order
               grad_rtol=1e-4, suite=("resnet18",)),
        Recipe("fsdp", "FSDP2 over NCCL: one process per GPU as ddp, each GPU holding half of the parameters, gradients "
               "and optimizer state between steps", {"parallel": "fsdp", "world_size": 2, "dist_backend": "nccl"},
               _TWO_GPUS, baseline="ddp", grad_rtol=1e-4, suite=("resnet18",)),
    ]
}


def get_recipe(name: str) -> Recipe:
    """A built-in recipe, or a user's own (``register_recipe``), by name."""
    found = RECIPES.get(name) or USER_RECIPES.get(name)
    if found is None:
        raise KeyError(f"unknown recipe {name!r}: expected one of {sorted(RECIPES | USER_RECIPES)}")
    return found


def without_unpredictable(config: TrainConfig) -> TrainConfig:
    """The nearest setup fake tensors can run: no compilation, one process with the same per-process batch
    (the unpredictable knobs, and those that only shape what they start, at their defaults)."""
    return config.with_defaults("unpredictable", "predicted_at_default")


# -- users' own knobs and recipes ------------------------------------------------------------------------------
# A user's recipe is the same entry as a built-in one: a knob with its rules and its effect (register_knob), and a
# recipe turning it with its guard tolerances, requirements and baseline (register_recipe). Cases find it by name
# (get_recipe), its budgets are keyed by its case id as any other's. The suite's own table (RECIPES) stays as it is.
USER_RECIPES: dict[str, Recipe] = {}


def register_knob(name: str, default: Any = False, effect: Effect | None = None, **entries) -> str:
    """A knob of a user's own (``trainbench.knob``): its default, what it does (``effect``, or the stage hooks as
    keywords: ``model=``, ``batch=``, ``forward=``, ``after_step=``, ``process=`` ...) and the table's rules
    (``Knob``'s fields: ``choices``, ``unpredictable``, ``same_tensors`` ...). Registering the same entry again
    (a module imported twice) is a no-op; another entry under a taken name is an error."""
    hooks = {stage: entries.pop(stage) for stage in STAGES if stage in entries}
    if effect is not None and hooks:
        raise ConfigError(f"knob {name!r}: give its effect as effect= or as stage hooks, not both")
    unknown = set(entries) - {f.name for f in dataclasses.fields(Knob)} - {"at_default"}
    if unknown:
        raise ConfigError(f"knob {name!r}: unknown entries {sorted(unknown)}; expected stage hooks {list(STAGES)} or "
                          f"rules {sorted(f.name for f in dataclasses.fields(Knob) if f.name != 'effect')}")
    if hooks or "at_default" in entries:
        effect = Effect(**hooks, at_default=entries.pop("at_default", False))
    if not name.isidentifier() or name in _DEFAULTS or hasattr(TrainConfig, name):
        raise ConfigError(f"knob {name!r}: expected a new identifier (the built-in knobs are {sorted(KNOBS)})")
    entry = (Knob(**entries, effect=effect), default)
    if name in USER_KNOBS and _identity(USER_KNOBS[name]) != _identity(entry):
        raise ConfigError(f"knob {name!r} is registered already with other entries")
    USER_KNOBS[name] = entry
    return name


def _identity(entry) -> tuple:
    """An entry as comparable data: its hooks by qualified name (a module imported again makes new function objects
    of the same hooks)."""
    def named(value):
        if callable(value) and hasattr(value, "__qualname__"):
            return f"{value.__module__}.{value.__qualname__}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return tuple((f.name, named(getattr(value, f.name))) for f in dataclasses.fields(value))
        return value if not isinstance(value, (tuple, list)) else tuple(map(named, value))
    return named(entry)


def register_recipe(recipe: Recipe) -> Recipe:
    """A user's recipe (``trainbench.recipe``), found by name beside the built-in ones."""
    if recipe.name in RECIPES:
        raise ConfigError(f"recipe {recipe.name!r} is a built-in recipe: give yours another name")
    if USER_RECIPES.get(recipe.name, recipe) != recipe:
        raise ConfigError(f"recipe {recipe.name!r} is registered already with other changes")
    USER_RECIPES[recipe.name] = recipe
    return recipe


def user_entries() -> tuple[dict, dict]:
    """The users' knobs and recipes registered now: a session restores them at its end (``restore_user_entries``),
    so one pytest session's registrations do not outlive it in a process that runs several."""
    return dict(USER_KNOBS), dict(USER_RECIPES)


def restore_user_entries(saved: tuple[dict, dict]) -> None:
    knobs, recipes = saved
    USER_KNOBS.clear()
    USER_KNOBS.update(knobs)
    USER_RECIPES.clear()
    USER_RECIPES.update(recipes)


def new_recipe(name: str, description: str, changes: Mapping[str, Any], **fields) -> Recipe:
    """``trainbench.recipe``: a user's recipe, registered (``register_recipe``) and returned; ``fields`` as
    ``Recipe``'s (``requires``, ``baseline``, ``loss_rtol``, ``grad_rtol``, ``extra_warmup_steps`` ...)."""
    return register_recipe(Recipe(name, description, dict(changes), **fields))
