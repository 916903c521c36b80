"""A planned case's memory predicted on the GPU profile under FakeTensorMode (``trainbench.core.analyses.predict``),
after its measurement, with a check of the method on the run itself."""

from __future__ import annotations

from dataclasses import dataclass

from trainbench.core.analyses.plan import CasePlan
from trainbench.core.analyses.predict import PredictionCache
from trainbench.core.records.result import Result
from trainbench.core.setups.recipes import ConfigError, TrainConfig, judging_overrides
from trainbench.core.setups.spec import TrainingSpec
from trainbench.core.setups.workloads import PROFILES, Profile, resolve_spec


@dataclass(frozen=True)
class CasePrediction:
    """Predicts planned cases' GPU-profile memory from one profile's runs, through the session's ``predictions``."""

    profile: Profile
    predictions: PredictionCache

    def predicted_setups(self, plan: CasePlan) -> tuple[tuple[str, TrainConfig, TrainingSpec], ...] | str:
        """The setups the case's memory prediction asks ``predictions`` for, as (profile, config, spec): the GPU
        profile's, then this profile's (the check of the method on the run itself); or why there is no GPU-profile
        setup. A ladder rung runs on a GPU what ``plan.gpu_recipe`` says, judged on rung 0's data path."""
        gpu, gpu_recipe = PROFILES["gpu"], plan.gpu_recipe or plan.recipe
        base = plan.baseline if plan.ladder is None else None
        try:
            gpu_spec = resolve_spec(plan.source, gpu)
            judged = judging_overrides(gpu_recipe, base, gpu, gpu_spec, plan.user_overrides) if base else {}
            gpu_config = gpu_recipe.config(gpu, **{**judged, **plan.user_overrides})
        except ConfigError as e:
            return f"no GPU-profile setup: {e}"
        return ("gpu", gpu_config, gpu_spec), (self.profile.name, plan.config, plan.spec)

    def memory(self, plan: CasePlan, result: Result) -> dict:
        """The GPU profile's memory predicted under FakeTensorMode, with a check of the method on this run itself:
        the prediction of the setup just measured against its measured breakdown (and allocator peak)."""
        setups = self.predicted_setups(plan)
        if isinstance(setups, str):
            return {"profile": "gpu", "reason": setups}
        gpu_setup, this_setup = setups
        predicted = {"profile": "gpu", **self.predictions(*gpu_setup)}
        if "breakdown_bytes" not in predicted:
            return predicted
        here = self.predictions(*this_setup)
        measured = result.memory_breakdown_bytes
        if "breakdown_bytes" in here and measured:
            differences = {k: [here["breakdown_bytes"].get(k, 0), v] for k, v in measured.items()
                           if here["breakdown_bytes"].get(k, 0) != v}
            predicted["check"] = {"profile": self.profile.name, "predicted_total": here["breakdown_bytes"]["total"],
                                  "measured_total": measured.get("total"), "matches": not differences,
                                  "differences": differences, "peak_allocated_bytes": result.peak_allocated_bytes}
        return predicted
