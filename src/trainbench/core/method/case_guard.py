"""The correctness guard of a planned case: the case must train what its baseline trains, within the recipe's
tolerance (``trainbench.core.setups.guards``): its loss trajectory, and its first-step gradients, against those of
setups trained from their seeds. The baselines' trajectories are kept for later cases of the same baseline."""

from __future__ import annotations

from dataclasses import replace

from trainbench.core.analyses.plan import CasePlan
from trainbench.core.harness.costs import spent
from trainbench.core.harness.watchdog import phase
from trainbench.core.records.outcome import CaseOutcome
from trainbench.core.setups import guards  # by module: tests replace its functions to see what the guard computes
from trainbench.core.setups.recipes import TrainConfig
from trainbench.core.setups.spec import TrainingSpec
from trainbench.core.setups.training import dropout_sites
from trainbench.devices.device import Backend


def dropout_in_the_way(config: TrainConfig, spec: TrainingSpec) -> tuple[list[str], str] | None:
    """The model's dropout sites and why its random masks cannot match its baseline's, or None: where the case splits
    the step's batch (accumulation, data-parallel shares, ranks), the parts draw other masks than the whole batch;
    where it compiles, the generated kernels draw them from their own random stream. Its guards then compare with
    dropout off on both sides (a rank case's ranks take their guard gradients so, ``distributed.measure_ddp``)."""
    split = max(config.accumulation_steps, config.shards)
    if split == 1 and not config.compiles:
        return None
    sites = dropout_sites(spec.model())
    if not sites:
        return None
    return sites, (f"draws other random masks for a batch split into {split} than for it whole" if split > 1 else
                   "draws its masks in the compiled kernels from another random stream than eager code")


class CaseGuard:
    """Guards planned cases on one device, keeping the baselines' loss trajectories of the session by setup."""

    def __init__(self, backend: Backend):
        self._backend = backend
        self._trajectories: dict[tuple, list[float]] = {}  # baseline losses for the loss guard

    def checks(self, plan: CasePlan, outcome: CaseOutcome, ddp_grads: dict | None = None
               ) -> tuple[guards.GuardCheck, ...]:
        """The case's guard verdicts (``ddp_grads``: the first-step gradients rank 0 recorded, for a rank case)."""
        with phase("the correctness guard"), spent("guard"):
            return tuple(self._checks(plan, outcome, ddp_grads))

    def _checks(self, plan: CasePlan, outcome: CaseOutcome, ddp_grads: dict | None) -> list[guards.GuardCheck]:
        dropout = dropout_in_the_way(plan.config, plan.spec)
        key = (*plan.setup_key(plan.baseline), "dropout off") if dropout else plan.setup_key(plan.baseline)
        runs = self.seeded_runs(plan, outcome, key, dropout_off=bool(dropout))
        verdicts = self._compared(plan, outcome, runs, key, ddp_grads)
        if not dropout:
            return verdicts
        sites, why = dropout
        why = (f" (with dropout off on both sides: the model's dropout ({', '.join(sites[:3])}"
               f"{', ...' if len(sites) > 3 else ''}) {why})")
        return [replace(v, message=v.message + why) for v in verdicts]

    def _compared(self, plan: CasePlan, outcome: CaseOutcome, runs: dict, key: tuple, ddp_grads: dict | None
                  ) -> list[guards.GuardCheck]:
        recipe, spec, config, base_config = plan.recipe, plan.spec, plan.config, plan.baseline_config
        verdicts = []
        if recipe.loss_rtol is not None and outcome.fresh_losses is not None:
            verdicts.append(guards.compare_trajectories(*outcome.fresh_losses, recipe.loss_rtol))
        elif recipe.loss_rtol is not None:
            if key not in self._trajectories:
                self._trajectories[key] = runs[base_config].losses
            verdicts.append(guards.compare_trajectories(runs[config].losses, self._trajectories[key], recipe.loss_rtol))
        if recipe.grad_rtol is not None:
            # The baseline in one process, its batch split into the case's shards as its ranks split it (BatchNorm
            # normalizes each rank's samples alone): what DDP's averaged gradients equal.
            base_grads = runs[base_config.one_process_equivalent(config.shards)].gradients
            # A rank case's: recorded by rank 0 while the case was measured.
            grads = ddp_grads if config.rank_processes else runs[config].gradients
            verdict = guards.compare_gradients(grads, base_grads, recipe.grad_rtol, recipe.grad_measure)
            verdicts.append(guards.with_likely_cause(verdict, config, spec))
        return verdicts

    def seeded_runs(self, plan: CasePlan, outcome: CaseOutcome, key: tuple, dropout_off: bool = False) -> dict:
        """What the case's guards need of setups trained from their seeds, each config built once for the case (the
        losses and the first gradients of one config come from one setup: ``guards.seeded_run``), by config.

        A guard's numbers are those of setups trained from their seeds, the same in every session. The setups the
        case and its baseline were measured with were such setups for their first steps: the losses of their warm-up's
        first steps (``Result.seeded_losses``) are the loss guard's trajectory, and no setup is built for them. What
        else the guards need (first-step gradients, a setup the measurement did not start from its seeds) is built
        here and does not outlive the case (the baseline's losses are kept, as numbers, for later cases of the same
        baseline)."""
        recipe, config, base_config = plan.recipe, plan.config, plan.baseline_config
        wants: dict = {}  # config -> what the guards take of it
        if recipe.loss_rtol is not None and outcome.fresh_losses is None:
            if key not in self._trajectories:
                wants.setdefault(base_config, set()).add("losses")
            wants.setdefault(config, set()).add("losses")
        shards_reference = None
        if recipe.grad_rtol is not None:
            reference = base_config.one_process_equivalent(config.shards)
            shards_reference = reference if config.shards > 1 else None
            wants.setdefault(reference, set()).add("gradients")
            if not config.rank_processes:
                wants.setdefault(config, set()).add("gradients")
        measured = {c: r.seeded_losses for c, r in ((base_config, outcome.baseline), (config, outcome.result))
                    if r is not None and r.seeded_losses and c != shards_reference and not dropout_off}
        runs = {}
        for c, want in wants.items():
            losses = measured.get(c) if "losses" in want else None
            build = want - {"losses"} if losses is not None else want
            run = (guards.seeded_run(c, plan.spec, self._backend, losses="losses" in build,
                                     gradients="gradients" in build, micro_batches_are_shards=c == shards_reference,
                                     dropout_off=dropout_off)
                   if build else guards.SeededRun())
            runs[c] = run if losses is None else replace(run, losses=losses)
        return runs
