"""Where groups of lockstep episodes run: a local process pool, or Ray tasks on a cluster.

An executor maps a group function over groups of episodes and yields the results in the groups'
order. The outcomes never depend on the executor: an episode's outcome depends only on the
episode (vlaeval.policy.rollout), so local and Ray runs give the same numbers. On Ray a worker
process that dies mid-task (OOM killer, preemption, a crash) loses nothing: Ray reruns its task --
the whole group, so every cluster in it -- up to `max_retries` times, and a group that still
cannot finish is a one-line error naming the executor.
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterator, Optional, Sequence

GroupFunction = Callable[..., Any]


class LocalExecutor:
    """`workers` forked processes (1: in this process)."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = max(int(workers), 1)

    def map_groups(self, function: GroupFunction, model: Any, groups: Sequence[Any], *args: Any) -> Iterator[Any]:
        if self.workers <= 1 or len(groups) <= 1:
            for group in groups:
                yield function(model, group, *args)
            return
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(self.workers, len(groups)), mp_context=context) as pool:
            futures = [pool.submit(function, model, group, *args) for group in groups]
            for future in futures:  # in submission order: the result keeps the episodes' order
                yield future.result()

    def describe(self) -> dict:
        return {"executor": "local", "workers": self.workers}

    def close(self) -> None:
        pass


class RayExecutor:
    """Ray tasks, one per group, one CPU each. `address`: None starts a local Ray instance (shut
    down by close()); "auto" or "ray://host:port" joins an existing cluster."""

    def __init__(self, address: Optional[str] = None, max_retries: int = 3) -> None:
        self.address = address
        self.max_retries = int(max_retries)
        self._started_here = False

    def _ray(self) -> Any:
        from vlaeval.errors import UserInputError

        try:
            import ray
        except ImportError:
            raise UserInputError(
                "gauntlet.executor=ray needs Ray: pip install 'vlaeval[ray]' (or use gauntlet.executor=local)"
            ) from None
        if not ray.is_initialized():
            try:
                ray.init(
                    address=self.address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
                )
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise UserInputError(
                    f"gauntlet.ray_address={self.address}: cannot join the Ray cluster ({type(error).__name__}: "
                    f"{str(error).splitlines()[0][:160]}); start it (`ray start --head`) or leave ray_address null "
                    "for a local instance"
                ) from None
            self._started_here = self.address is None
        return ray

    def map_groups(self, function: GroupFunction, model: Any, groups: Sequence[Any], *args: Any) -> Iterator[Any]:
        ray = self._ray()
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)(function)
        model_ref = ray.put(model)  # shipped to the object store once, shared by every task
        refs = [remote.remote(model_ref, group, *args) for group in groups]
        for ref in refs:
            try:
                yield ray.get(ref)
            except ray.exceptions.WorkerCrashedError as error:
                raise RuntimeError(
                    f"a Ray worker died {self.max_retries + 1} times running one group of episodes; "
                    f"its clusters could not be produced ({str(error).splitlines()[0][:160]})"
                ) from None

    def describe(self) -> dict:
        return {"executor": "ray", "address": self.address or "local instance", "max_retries": self.max_retries}

    def close(self) -> None:
        if self._started_here:
            import ray

            ray.shutdown()
            self._started_here = False


def make_executor(kind: str, workers: int, address: Optional[str] = None) -> Any:
    return RayExecutor(address) if str(kind) == "ray" else LocalExecutor(workers)
