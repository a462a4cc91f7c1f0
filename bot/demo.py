"""`gpuci demo`: the sample repository's batches on a simulated 8-GPU host, with summaries."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

from bot.config import load_config
from bot.redis_local import RedisUnavailable, local_redis
from bot.settings import Settings

SAMPLE_REPO = Path(__file__).resolve().parent.parent / "examples" / "sample-repo"
DEMO_BACKEND = "sim:8xH20-96GB"


def say(message: str) -> None:
    print(message, flush=True)


def run_demo(settings: Settings, *, once: bool = True) -> int:
    """Run every batch of the sample repository locally and print each Check Run."""
    from workers.batch import run_on_host

    config = load_config((SAMPLE_REPO / ".gpuci.yml").read_text(), ".gpuci.yml")
    try:
        with local_redis(settings.redis_url) as url, tempfile.TemporaryDirectory() as work:
            demo = dataclasses.replace(
                settings,
                redis_url=url,
                gpu_backend=DEMO_BACKEND,
                host="demo-gpu-01",
                work_dir=work,
                kill_grace_s=2.0,
                idle_sample_interval_s=0.01,
            )
            say(
                f"gpuci demo: {len(config.batches)} batches of {SAMPLE_REPO.name} "
                f"on a simulated host ({DEMO_BACKEND}), Redis at {url}\n"
            )
            for n, name in enumerate(config.batches, 1):
                say(
                    f"[{n}/{len(config.batches)}] batch {name} "
                    f"({config.batches[name].gpus} GPUs) ..."
                )
                result = run_on_host(
                    settings=demo,
                    config=config,
                    batch_name=name,
                    source=SAMPLE_REPO,
                    sha="",
                    progress=lambda m: say(f"    {m}"),
                )
                say(
                    _render(
                        result.batch,
                        result.conclusion.value,
                        result.output.title,
                        result.output.summary,
                    )
                )
    except RedisUnavailable as exc:
        print(f"gpuci demo: {exc}", file=sys.stderr)
        return 2
    say("demo finished: every batch above ran for real (pytest, JUnit) on simulated GPUs.")
    return 0


def _render(batch: str, conclusion: str, title: str, summary: str) -> str:
    from workers.checks import as_terminal

    rule = "-" * 72
    head = f"gpuci / batch {batch}: {conclusion.upper()} - {title}"
    return f"{rule}\n{head}\n{rule}\n{as_terminal(summary)}\n"
