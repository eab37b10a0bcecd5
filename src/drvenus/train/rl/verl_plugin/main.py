"""``python -m drvenus.train.rl.verl_plugin.main [hydra overrides]``: verl's PPO trainer with the
drvenus IGPO pieces installed in every process that needs them.

verl runs its trainer in a Ray actor (``TaskRunner``); our subclass registers the agent loop,
reward manager and advantage estimator there, swaps verl's ``compute_advantage`` for
:func:`~.advantage.compute_advantage`, caps each turn on the rollout servers
(:mod:`.servers`), and uses :class:`IGPOTrainer`, which hands the reward manager the actor
worker group (the IG scoring hook) and writes the rollouts' trace events
(:func:`traced_generation`). Rollout workers import the agent loop from
its ``_target_`` in the agent-loop config. Overrides are verl's (``verl/trainer/config``);
:mod:`.launch` writes them from a drvenus RL config.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import hydra
import numpy as np
import ray
from verl.protocol import DataProto
from verl.trainer import main_ppo
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from drvenus.agent.events import write_events
from drvenus.train.rl.collect import trace_file
from drvenus.train.rl.verl_plugin.convert import EXTRA_EVENTS, STEP_KEY

log = logging.getLogger(__name__)


def install() -> None:
    """Register our verl pieces in this process (idempotent)."""
    from verl.trainer.ppo import ray_trainer

    from drvenus.train.rl.verl_plugin import advantage, agent_loop, reward, servers  # noqa: F401

    ray_trainer.compute_advantage = advantage.compute_advantage
    servers.install()  # the per-turn cap on the rollout servers
    main_ppo.RayPPOTrainer = IGPOTrainer


def traced_generation(generate: Callable[[DataProto], DataProto], folder: str | None
                      ) -> Callable[[DataProto], DataProto]:
    """The rollout manager's ``generate_sequences`` with trace events: each training row is
    told its step (:data:`~.convert.STEP_KEY`; verl gives the agent loops none), and the
    events the agent loops kept on a traced step leave the batch here, written in row order
    (question, then rollout) to ``folder/step-NNNNNN.events.jsonl`` as the one-machine trainer
    writes them. ``folder``: ``trainer.rollout_data_dir`` (the launcher's ``OUTPUT/traces``);
    None: no traces. Validation rows get no step."""
    def generate_sequences(prompts: DataProto) -> DataProto:
        step = prompts.meta_info.get("global_steps")
        if folder is None or step is None or prompts.meta_info.get("validate", False):
            return generate(prompts)
        column = np.full(len(prompts), int(step), dtype=object)
        tagged = DataProto(batch=prompts.batch, meta_info=prompts.meta_info,
                           non_tensor_batch={**prompts.non_tensor_batch, STEP_KEY: column})
        output = generate(tagged)
        kept = output.non_tensor_batch.pop(EXTRA_EVENTS, None)
        if kept is not None:
            path = write_events(trace_file(folder, int(step), events=True),
                                (event for row in kept if row for event in row))
            log.info("step %s: the rollouts' trace events are in %s", step, path)
        return output

    return generate_sequences


class IGPOTrainer(RayPPOTrainer):
    """verl's trainer, plus the IG scoring hook and the rollouts' trace events."""

    def init_workers(self) -> None:
        super().init_workers()
        for fn in (self.reward_fn, self.val_reward_fn):
            if hasattr(fn, "attach_actor"):
                fn.attach_actor(self.actor_rollout_wg)
        if self.async_rollout_mode:
            manager = self.async_rollout_manager
            manager.generate_sequences = traced_generation(
                manager.generate_sequences, self.config.trainer.get("rollout_data_dir"))


class IGPOTaskRunner(main_ppo.TaskRunner):
    def run(self, config: Any) -> Any:
        install()
        return super().run(config)


@hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
def main(config: Any) -> None:
    install()
    main_ppo.run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(IGPOTaskRunner))


if __name__ == "__main__":
    main()
