"""Where groups of lockstep episodes run: a local process pool, or Ray tasks on a cluster.

An executor maps a group function over argument tuples (one per group of episodes; several
policies' groups may be mixed) and yields the results in order. The outcomes never depend on the
executor: an episode's outcome depends only on the episode (vlaeval.rollouts.engine), so local and
Ray runs give the same numbers. The local pool is kept until close(), so a gauntlet that asks for
outcomes batch by batch forks its workers once (after the scenes are built: the workers inherit
them). On Ray a worker process that dies mid-task (OOM killer, preemption, a crash) loses nothing:
Ray reruns its task -- the whole group, so every cluster in it -- up to `max_retries` times, and a
group that still cannot finish is an error naming the executor.
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

GroupFunction = Callable[..., Any]


class LocalExecutor:
    """`workers` forked processes (1: in this process), forked on first use and kept until close()."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = max(int(workers), 1)
        self._pool: Optional[ProcessPoolExecutor] = None

    def map_groups(self, function: GroupFunction, calls: Sequence[Tuple[Any, ...]]) -> Iterator[Any]:
        if self.workers <= 1 or len(calls) <= 1:
            for args in calls:
                yield function(*args)
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("fork"))
        futures = [self._pool.submit(function, *args) for args in calls]
        for future in futures:  # in submission order: the result keeps the episodes' order
            yield future.result()

    def describe(self) -> Dict[str, Any]:
        return {"executor": "local", "workers": self.workers}

    def restart_workers(self) -> None:
        """The next call forks new workers (they inherit what this process built since)."""
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class RayExecutor:
    """Ray tasks, one per group, one CPU each. `address`: None starts a local Ray instance (shut
    down by close()); "auto" or "ray://host:port" joins an existing cluster. A call's first
    argument (the policy) is put in the object store once per distinct object."""

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
                "rollout.executor=ray needs Ray: pip install 'vlaeval[ray]' (or use rollout.executor=local)"
            ) from None
        if not ray.is_initialized():
            try:
                ray.init(
                    address=self.address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
                )
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise UserInputError(
                    f"rollout.ray_address={self.address}: cannot join the Ray cluster ({type(error).__name__}: "
                    f"{str(error).splitlines()[0][:160]}); start it (`ray start --head`) or leave ray_address null "
                    "for a local instance"
                ) from None
            self._started_here = self.address is None
        return ray

    def map_groups(self, function: GroupFunction, calls: Sequence[Tuple[Any, ...]]) -> Iterator[Any]:
        ray = self._ray()
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)(function)
        shipped: Dict[int, Any] = {}  # each policy goes to the object store once, shared by its tasks
        refs = []
        for model, *rest in calls:
            if id(model) not in shipped:
                shipped[id(model)] = ray.put(model)
            refs.append(remote.remote(shipped[id(model)], *rest))
        for ref in refs:
            try:
                yield ray.get(ref)
            except ray.exceptions.WorkerCrashedError as error:
                raise RuntimeError(
                    f"a Ray worker died {self.max_retries + 1} times running one group of episodes; "
                    f"its clusters could not be produced ({str(error).splitlines()[0][:160]})"
                ) from None

    def describe(self) -> Dict[str, Any]:
        return {"executor": "ray", "address": self.address or "local instance", "max_retries": self.max_retries}

    def restart_workers(self) -> None:
        pass  # Ray's workers are long-lived processes that build (and keep) the scenes they need

    def close(self) -> None:
        if self._started_here:
            import ray

            ray.shutdown()
            self._started_here = False


def make_executor(kind: str, workers: int, address: Optional[str] = None) -> Any:
    return RayExecutor(address) if str(kind) == "ray" else LocalExecutor(workers)
