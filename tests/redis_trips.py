"""A Redis client that counts its round trips (a pipeline or a script is one), for tests and
bench/fleet_round.py."""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.client import Pipeline


class CountingPipeline(Pipeline):
    """A pipeline whose `execute` is one round trip (WATCHed reads are one each)."""

    trips: list[int]

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self.trips[0] += 1
        return super().execute(raise_on_error)

    def immediate_execute_command(self, *args: Any, **options: Any) -> Any:
        self.trips[0] += 1
        return super().immediate_execute_command(*args, **options)


class CountingRedis(Redis):
    """A Redis client that counts its round trips."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trips = [0]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.trips[0] += 1
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        pipe = CountingPipeline(self.connection_pool, self.response_callbacks, transaction, None)
        pipe.trips = self.trips
        return pipe
