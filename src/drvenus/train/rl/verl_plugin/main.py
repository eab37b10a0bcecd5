"""``python -m drvenus.train.rl.verl_plugin.main [hydra overrides]``: verl's PPO trainer with the
drvenus IGPO pieces installed in every process that needs them.

verl runs its trainer in a Ray actor (``TaskRunner``); our subclass registers the agent loop,
reward manager and advantage estimator there, swaps verl's ``compute_advantage`` for
:func:`~.advantage.compute_advantage`, caps each turn on the rollout servers
(:mod:`.servers`), and uses :class:`IGPOTrainer`, which hands the reward manager the actor
worker group (the IG scoring hook). Rollout workers import the agent loop from
its ``_target_`` in the agent-loop config. Overrides are verl's (``verl/trainer/config``);
:mod:`.launch` writes them from a drvenus RL config.
"""

from __future__ import annotations

from typing import Any

import hydra
import ray
from verl.trainer import main_ppo
from verl.trainer.ppo.ray_trainer import RayPPOTrainer


def install() -> None:
    """Register our verl pieces in this process (idempotent)."""
    from verl.trainer.ppo import ray_trainer

    from drvenus.train.rl.verl_plugin import advantage, agent_loop, reward, servers  # noqa: F401

    ray_trainer.compute_advantage = advantage.compute_advantage
    servers.install()  # the per-turn cap on the rollout servers
    main_ppo.RayPPOTrainer = IGPOTrainer


class IGPOTrainer(RayPPOTrainer):
    """verl's trainer, plus the IG scoring hook."""

    def init_workers(self) -> None:
        super().init_workers()
        for fn in (self.reward_fn, self.val_reward_fn):
            if hasattr(fn, "attach_actor"):
                fn.attach_actor(self.actor_rollout_wg)


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
