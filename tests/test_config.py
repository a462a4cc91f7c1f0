"""`.gpuci.yml` loading, every located error, durations and sizes, and host inventory checks."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import contract.config
from contract.config import (
    Batch,
    Config,
    ConfigError,
    ConfigIssue,
    HostGpu,
    Layer,
    Runtime,
    check_file,
    check_hosts,
    cron_problem,
    format_duration,
    gpu_matches,
    inventory_runtimes,
    load_config,
    load_hosts,
    natural_sort,
    parse_duration,
    parse_size,
    why_unrunnable,
)

DESIGN_EXAMPLE = """\
version: 1
approval_label: gpuci/approved
runtime:                     # how to prepare a checkout, run on the GPU host
  setup: ["pip install -e . --no-deps"]
pytest_args: ["-ra", "--tb=short"]
layers:
  "2": {batches: ["2", "5"], trigger: pull_request}
  "3": {batches: all, schedule: "0 16 * * 6"}      # cron, default branch
batches:
  "2":  {gpus: 1, tests: [tests/test_optimizer], timeout: 40m}
  "5":  {gpus: 2, tests: [tests/test_cluster], timeout: 90m}
  "10": {gpus: 8, tests: [tests/test_infer], timeout: 6h, markers: largedist,
         min_compute_capability: "8.0", workers: auto, vram_per_worker: 6GiB}
  "11": {gpus: 2, tests: [tests/test_gemini], timeout: 150m, allow_no_tests: true}
"""

# A valid file whose next line (4) is where each error case puts its batch.
BASE = "version: 1\nbatches:\n  unit: {gpus: 1}\n"


def issues_of(text: str, filename: str = ".gpuci.yml") -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(text, filename)
    assert str(caught.value) == "\n".join(str(i) for i in caught.value.issues)
    return [str(issue) for issue in caught.value.issues]


def one_batch(body: str) -> Batch:
    return load_config(f"version: 1\nbatches:\n  b: {{{body}}}\n").batches["b"]


# --- valid configs ---------------------------------------------------------------------------


def test_design_example_loads_exactly() -> None:
    config = load_config(DESIGN_EXAMPLE)

    assert config == Config(
        version=1,
        approval_label="gpuci/approved",
        runtimes={"default": Runtime("default", setup=("pip install -e . --no-deps",))},
        pytest_args=("-ra", "--tb=short"),
        layers={
            "2": Layer("2", ("2", "5"), trigger="pull_request"),
            "3": Layer("3", ("2", "5", "10", "11"), schedule="0 16 * * 6"),
        },
        batches={
            "2": Batch("2", gpus=1, tests=("tests/test_optimizer",), timeout_s=40 * 60),
            "5": Batch("5", gpus=2, tests=("tests/test_cluster",), timeout_s=90 * 60),
            "10": Batch(
                "10",
                gpus=8,
                tests=("tests/test_infer",),
                timeout_s=6 * 3600,
                markers="largedist",
                min_compute_capability=(8, 0),
                workers="auto",
                vram_per_worker_mb=6 * 1024,
            ),
            "11": Batch(
                "11", gpus=2, tests=("tests/test_gemini",), timeout_s=150 * 60, allow_no_tests=True
            ),
        },
    )
    assert config.auto_batches() == ("2", "5")
    assert config.lines["batches.10"] == 12
    assert config.lines["batches.11"] == 14


def test_minimal_config_gets_the_documented_defaults() -> None:
    config = load_config("version: 1\nbatches:\n  unit: {gpus: 1}\n")

    assert config.approval_label == "gpuci/approved"
    assert config.pytest_args == ("-ra", "--tb=short")
    assert config.setup == ()
    assert config.env == {}
    assert config.layers == {}
    assert config.auto_batches() == ()
    assert config.batches["unit"] == Batch("unit", gpus=1, tests=(), timeout_s=3600)


@pytest.mark.parametrize(
    ("body", "attribute", "expected"),
    [
        ("gpus: 0", "gpus", 0),
        ("gpus: 64", "gpus", 64),
        ("gpus: 1, tests: tests/unit", "tests", ("tests/unit",)),
        ("gpus: 1, tests: [a/test_x.py::test_y, b]", "tests", ("a/test_x.py::test_y", "b")),
        ("gpus: 1, timeout: 90", "timeout_s", 90),
        ("gpus: 1, timeout: 1h30m15s", "timeout_s", 5415),
        ("gpus: 1, markers: not slow and gpu", "markers", "not slow and gpu"),
        ("gpus: 1, pytest_args: \"-x -k 'not slow'\"", "pytest_args", ("-x", "-k", "not slow")),
        ("gpus: 1, pytest_args: [-x, --maxfail=2]", "pytest_args", ("-x", "--maxfail=2")),
        (
            "gpus: 1, env: {A: yes, B: 1.0, C: '', D: 007}",
            "env",
            {"A": "yes", "B": "1.0", "C": "", "D": "007"},
        ),
        ("gpus: 1, workers: 4", "workers", 4),
        ("gpus: 1, workers: auto, vram_per_worker: 512MiB", "vram_per_worker_mb", 512),
        ("gpus: 1, gpu_model: H20", "gpu_model", "H20"),
        ("gpus: 1, gpu_model: 4090", "gpu_model", "4090"),
        ("gpus: 1, min_memory: 80GB", "min_memory_mb", 76293),
        ("gpus: 1, min_compute_capability: 8.6", "min_compute_capability", (8, 6)),
        ("gpus: 1, min_compute_capability: '9'", "min_compute_capability", (9, 0)),
        ("gpus: 1, allow_no_tests: true", "allow_no_tests", True),
    ],
)
def test_batch_keys_are_read(body: str, attribute: str, expected: object) -> None:
    assert getattr(one_batch(body), attribute) == expected


@pytest.mark.parametrize(
    ("top", "attribute", "expected"),
    [
        ("approval_label: run-on-gpu", "approval_label", "run-on-gpu"),
        ("runtime: {setup: make deps}", "setup", ("make deps",)),
        ("runtime: {setup: [a, b]}", "setup", ("a", "b")),
        ("runtime: {}", "setup", ()),
        ("pytest_args: -q --tb=line", "pytest_args", ("-q", "--tb=line")),
        ("pytest_args: []", "pytest_args", ()),
        ("env: {HF_HOME: /cache/hf, SEED: 0}", "env", {"HF_HOME": "/cache/hf", "SEED": "0"}),
    ],
)
def test_top_level_keys_are_read(top: str, attribute: str, expected: object) -> None:
    config = load_config(f"version: 1\n{top}\nbatches:\n  unit: {{gpus: 1}}\n")

    assert getattr(config, attribute) == expected


def test_integer_names_and_layer_all_sort_naturally() -> None:
    config = load_config(
        "version: 1\n"
        "layers:\n  2: {batches: [10, 4a], trigger: pull_request}\n"
        "  quick: {batches: [2], trigger: pull_request}\n  3: {batches: all}\n"
        "batches:\n  10: {gpus: 1}\n  2: {gpus: 1}\n  4a: {gpus: 1}\n  gemini: {gpus: 0}\n"
    )

    assert list(config.batches) == ["10", "2", "4a", "gemini"]
    assert config.layers["3"].batches == ("2", "4a", "10", "gemini")
    assert config.layers["2"].batches == ("10", "4a")
    assert config.auto_batches() == ("2", "4a", "10")


# --- errors: each kind, with its line and key path -------------------------------------------

ERRORS = [
    # (text, the one issue a user sees)
    ("version: 2\nbatches: {u: {gpus: 1}}\n",
     ".gpuci.yml:1: version: version 2 is not supported; this gpuci reads version: 1"),
    ("version: '1'\nbatches: {u: {gpus: 1}}\n",
     ".gpuci.yml:1: version: expected the number 1 (write version: 1), found '1'"),
    ("batches: {u: {gpus: 1}}\n",
     ".gpuci.yml:1: missing required key 'version'; start the file with version: 1"),
    ("version: 1\n",
     ".gpuci.yml:1: missing required key 'batches'; "
     "define the batches, e.g. batches: {unit: {gpus: 1, tests: [tests]}}"),
    ("version: 1\nbatches: {}\n",
     ".gpuci.yml:2: batches: no batches defined; add one, e.g. unit: {gpus: 1, tests: [tests]}"),
    ("version: 1\nbatches: [unit]\n",
     ".gpuci.yml:2: batches: expected a mapping of keys, found a list"),
    (BASE + "  b: {tests: [t]}\n",
     ".gpuci.yml:4: batches.b: missing required key 'gpus'; "
     "say how many GPUs the batch needs, e.g. gpus: 1 (0 for CPU only)"),
    (BASE + "  b: {gpus: two}\n",
     ".gpuci.yml:4: batches.b.gpus: expected a whole number of GPUs from 0 to 64, found 'two'"),
    (BASE + "  b: {gpus: true}\n",
     ".gpuci.yml:4: batches.b.gpus: expected a whole number of GPUs from 0 to 64, found 'true'"),
    (BASE + "  b: {gpus: 65}\n",
     ".gpuci.yml:4: batches.b.gpus: gpus must be from 0 to 64, found 65"),
    (BASE + "  b: {gpus: -1}\n",
     ".gpuci.yml:4: batches.b.gpus: gpus must be from 0 to 64, found -1"),
    (BASE + "  b: {gpus: 1, tests: []}\n",
     ".gpuci.yml:4: batches.b.tests: the list is empty; list test paths, or remove tests"),
    (BASE + "  b: {gpus: 1, tests: {a: 1}}\n",
     ".gpuci.yml:4: batches.b.tests: expected a string or a list of strings, found a mapping"),
    (BASE + "  b: {gpus: 1, tests: /abs/tests}\n",
     ".gpuci.yml:4: batches.b.tests: test path '/abs/tests' is absolute; "
     "give it relative to the repository root"),
    (BASE + "  b:\n    gpus: 1\n    tests:\n      - ok\n      - a/../../x\n",
     ".gpuci.yml:8: batches.b.tests[1]: test path 'a/../../x' leaves the repository ('..'); "
     "remove the '..'"),
    (BASE + "  b: {gpus: 1, tests: [-x]}\n",
     ".gpuci.yml:4: batches.b.tests[0]: '-x' is an option, not a test path; put it in pytest_args"),
    (BASE + "  b: {gpus: 1, timeout: soon}\n",
     ".gpuci.yml:4: batches.b.timeout: 'soon' is not a duration; write e.g. 90s, 40m, 6h or 1h30m"),
    (BASE + "  b: {gpus: 1, timeout: 0}\n",
     ".gpuci.yml:4: batches.b.timeout: a duration must be more than 0 seconds, found 0"),
    (BASE + "  b: {gpus: 1, timeout: 1.5}\n",
     ".gpuci.yml:4: batches.b.timeout: expected a duration such as 90s, 40m, 6h or 1h30m, "
     "found '1.5'"),
    (BASE + "  b: {gpus: 1, markers: ''}\n",
     ".gpuci.yml:4: batches.b.markers: the string is empty; give a value or remove the key"),
    (BASE + "  b: {gpus: 1, pytest_args: '-x \"unclosed'}\n",
     ".gpuci.yml:4: batches.b.pytest_args: cannot split '-x \"unclosed' into arguments "
     "(No closing quotation); check quotes"),
    (BASE + "  b: {gpus: 1, pytest_args: [-x, 3]}\n",
     ".gpuci.yml:4: batches.b.pytest_args[1]: expected a string (quote numbers), found '3'"),
    (BASE + "  b: {gpus: 1, pytest_args: -n4}\n",
     ".gpuci.yml:4: batches.b.pytest_args: -n is not allowed in pytest_args: "
     "use the batch's workers key"),
    (BASE + "  b: {gpus: 1, pytest_args: [--junitxml=out.xml]}\n",
     ".gpuci.yml:4: batches.b.pytest_args: --junitxml is not allowed in pytest_args: "
     "gpuci sets it to collect results"),
    (BASE + "  b: {gpus: 1, env: [A]}\n",
     ".gpuci.yml:4: batches.b.env: expected a mapping of keys, found a list"),
    (BASE + "  b:\n    gpus: 1\n    env:\n      CUDA_VISIBLE_DEVICES: 0\n",
     ".gpuci.yml:7: batches.b.env.CUDA_VISIBLE_DEVICES: "
     "CUDA_VISIBLE_DEVICES is set by gpuci from the leased GPUs; remove it"),
    (BASE + "  b: {gpus: 1, env: {2FAST: x}}\n",
     ".gpuci.yml:4: batches.b.env.2FAST: '2FAST' is not a valid variable name; "
     "use letters, digits and _, not first a digit"),
    (BASE + "  b: {gpus: 1, env: {A: }}\n",
     ".gpuci.yml:4: batches.b.env.A: expected a string value, found nothing (null); "
     "write '' for an empty one"),
    (BASE + "  b: {gpus: 1, env: {A: [1]}}\n",
     ".gpuci.yml:4: batches.b.env.A: expected a string value, found a list; "
     "write '' for an empty one"),
    (BASE + "  b: {gpus: 1, workers: 0}\n",
     ".gpuci.yml:4: batches.b.workers: workers must be 1 or more, or \"auto\", found '0'"),
    (BASE + "  b: {gpus: 1, workers: 0, vram_per_worker: 6GiB}\n",
     ".gpuci.yml:4: batches.b.workers: workers must be 1 or more, or \"auto\", found '0'"),
    (BASE + "  b: {gpus: 1, workers: many}\n",
     ".gpuci.yml:4: batches.b.workers: workers must be 1 or more, or \"auto\", found 'many'"),
    (BASE + "  b: {gpus: 1, workers: auto}\n",
     ".gpuci.yml:4: batches.b.workers: workers: auto needs vram_per_worker (e.g. 6GiB) "
     "to size the workers"),
    (BASE + "  b: {gpus: 1, workers: 2, vram_per_worker: 6GiB}\n",
     ".gpuci.yml:4: batches.b.vram_per_worker: vram_per_worker applies only with workers: auto; "
     "set workers: auto or remove it"),
    (BASE + "  b: {gpus: 1, min_memory: 80}\n",
     ".gpuci.yml:4: batches.b.min_memory: 80 has no unit; write e.g. 80GiB or 80MiB"),
    (BASE + "  b: {gpus: 1, min_memory: lots}\n",
     ".gpuci.yml:4: batches.b.min_memory: 'lots' is not a size; write e.g. 512MiB, 6GiB, 80GB"),
    (BASE + "  b: {gpus: 1, min_compute_capability: eight}\n",
     ".gpuci.yml:4: batches.b.min_compute_capability: 'eight' is not a compute capability; "
     "write e.g. \"8.0\""),
    (BASE + "  b: {gpus: 1, allow_no_tests: maybe}\n",
     ".gpuci.yml:4: batches.b.allow_no_tests: expected true or false, found 'maybe'"),
    (BASE + "  b: {gpus: 0, gpu_model: H20}\n",
     ".gpuci.yml:4: batches.b.gpu_model: the batch asks for gpus: 0, so gpu_model has no GPU "
     "to apply to; set gpus or remove it"),
    (BASE + "  b c: {gpus: 1}\n",
     ".gpuci.yml:4: batches.b c: batch name 'b c' may use only letters, digits, '.', '_', '-'"),
    (BASE + "  unit: {gpus: 2}\n",
     ".gpuci.yml:4: batches.unit: repeated key; keep only one"),
    (BASE + "layers:\n  2: {batches: [unit, 7]}\n",
     ".gpuci.yml:5: layers.2.batches[1]: layer 2 names batch 7, which is not defined; "
     "defined batches: unit"),
    (BASE + "layers:\n  2: {batches: [unit, unit]}\n",
     ".gpuci.yml:5: layers.2.batches[1]: batch unit is listed twice; remove the repeat"),
    (BASE + "layers:\n  2: {batches: some}\n",
     ".gpuci.yml:5: layers.2.batches: expected a list of batch names or \"all\", found 'some'"),
    (BASE + "layers:\n  2: {trigger: pull_request}\n",
     ".gpuci.yml:5: layers.2: missing required key 'batches'; "
     "list the layer's batches, e.g. batches: [unit], or batches: all"),
    (BASE + "layers:\n  2: {batches: all, trigger: push}\n",
     ".gpuci.yml:5: layers.2.trigger: trigger 'push' is not supported; use pull_request "
     "(runs for trusted PRs), schedule for timed runs, or no trigger to run the layer only on "
     "command"),
    (BASE + "layers:\n  3: {batches: all, schedule: '0 16 * *'}\n",
     ".gpuci.yml:5: layers.3.schedule: a schedule needs 5 fields (minute hour day-of-month month "
     "day-of-week), found 4 in '0 16 * *'; e.g. '0 16 * * 6' is Saturdays at 16:00"),
    (BASE + "layers:\n  3: {batches: all, schedule: '0 24 * * 6'}\n",
     ".gpuci.yml:5: layers.3.schedule: hour field '24': '24' is outside 0-23; "
     "e.g. '0 16 * * 6' is Saturdays at 16:00"),
    ("version: 1\napproval_label: " + "x" * 51 + "\nbatches: {u: {gpus: 1}}\n",
     ".gpuci.yml:2: approval_label: GitHub labels are at most 50 characters, found 51"),
    ("version: 1\nruntime: {setup: []}\nbatches: {u: {gpus: 1}}\nenv: {A: 1}\nruntime2: 1\n",
     ".gpuci.yml:5: runtime2: unknown key 'runtime2'; did you mean 'runtime'?"),
    ("version: 1\nrunner: {}\nbatches: {u: {gpus: 1}}\n",
     ".gpuci.yml:2: runner: unknown key 'runner'; did you mean 'runtime'?"),
    ("version: 1\nbatches:\n  u:\n    gpus: 1\n    timout: 40m\n",
     ".gpuci.yml:5: batches.u.timout: unknown key 'timout'; did you mean 'timeout'?"),
    (BASE + "layers:\n  2: {batches: all, schedul: '0 1 * * *'}\n",
     ".gpuci.yml:5: layers.2.schedul: unknown key 'schedul'; did you mean 'schedule'?"),
    ("version: 1\nbatches: {u: {gpus: 1}}\nruntime: {zzz: 1}\n",
     ".gpuci.yml:3: runtime.zzz: unknown key 'zzz'; valid keys are base, caches, env, expect, "
     "image, network, setup"),
    ("version: 1\nbatches: {u: {gpus: 1}}\nlayers: {2: {batches: all, qqq: 1}}\n",
     ".gpuci.yml:3: layers.2.qqq: unknown key 'qqq'; valid keys are batches, schedule, trigger"),
    ("- version: 1\n", ".gpuci.yml:1: expected a mapping of keys, found a list"),
    ("", ".gpuci.yml:1: the file is empty; start with version: 1 and a batches mapping"),
    ("version: 1\nbatches:\n  u: {gpus: 1\n",
     ".gpuci.yml:4: YAML syntax error: expected ',' or '}', but got '<stream end>'; "
     "check indentation and quotes here"),
    ("version: 1\n\tbatches: {}\n",
     ".gpuci.yml:2: YAML syntax error: found character '\\t' that cannot start any token; "
     "check indentation and quotes here"),
    ("version: 1\n---\nversion: 1\n",
     ".gpuci.yml:2: YAML syntax error: but found another document; "
     "check indentation and quotes here"),
    ("version: 1\nbatches:\n  b: !!python/object:os.system {gpus: 1}\n",
     ".gpuci.yml:3: YAML tag 'tag:yaml.org,2002:python/object:os.system' is not supported; "
     "remove it"),
    ("version: 1\nbatches: {u: {gpus: !!int two}}\n",
     ".gpuci.yml:2: batches.u.gpus: 'two' is not a valid !!int; fix the value or remove the tag"),
    ("version: 1\nbatches: {u: {gpus: 1, allow_no_tests: !!bool maybe}}\n",
     ".gpuci.yml:2: batches.u.allow_no_tests: 'maybe' is not a valid !!bool; "
     "fix the value or remove the tag"),
    ("version: 1\nbatches: {u: {gpus: 1}, [a]: {gpus: 1}}\n",
     ".gpuci.yml:2: batches: keys must be plain names, found a list"),
    ("version: 1\nbatches: {u: 3}\n",
     ".gpuci.yml:2: batches.u: expected a mapping of keys, found '3'"),
    (BASE + "layers: [1]\n", ".gpuci.yml:4: layers: expected a mapping of keys, found a list"),
    (BASE + "runtime: make\n",
     ".gpuci.yml:4: runtime: the default runtime names runtime 'make', but there is no runtimes "
     "mapping; define it (runtimes: {make: {base: NAME}}) or write runtime: {setup: [...]}"),
    (BASE + "layers: {2: {batches: [[unit]]}}\n",
     ".gpuci.yml:4: layers.2.batches[0]: expected a batch name, found a list"),
    (BASE + "  b: {gpus: 0, workers: auto, vram_per_worker: 1GiB}\n",
     ".gpuci.yml:4: batches.b.workers: workers: auto divides GPU memory, and the batch has "
     "gpus: 0; give a number of workers"),
    ("version: !!str 1\nbatches: {u: {gpus: 1}}\n",
     ".gpuci.yml:1: version: expected the number 1 (write version: 1), found '1'"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), ERRORS)
def test_each_error_is_located_and_says_what_to_do(text: str, expected: str) -> None:
    assert issues_of(text) == [expected]


def test_every_error_is_reported_at_once_in_line_order() -> None:
    text = (
        "version: 1\n"
        "layers:\n"
        "  2: {batches: [2, 7], trigger: pull_request}\n"
        "batches:\n"
        "  2: {gpus: 1, timout: 40m}\n"
        "  5: {gpus: two}\n"
        "  10:\n"
        "    gpus: 8\n"
        "    min_memory: 6\n"
        "    env: {CUDA_VISIBLE_DEVICES: '0,1'}\n"
        "aproval_label: x\n"
    )

    assert issues_of(text, "repo/.gpuci.yml") == [
        "repo/.gpuci.yml:3: layers.2.batches[1]: layer 2 names batch 7, which is not defined; "
        "defined batches: 2, 5, 10",
        "repo/.gpuci.yml:5: batches.2.timout: unknown key 'timout'; did you mean 'timeout'?",
        "repo/.gpuci.yml:6: batches.5.gpus: expected a whole number of GPUs from 0 to 64, "
        "found 'two'",
        "repo/.gpuci.yml:9: batches.10.min_memory: 6 has no unit; write e.g. 6GiB or 6MiB",
        "repo/.gpuci.yml:10: batches.10.env.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES is set by "
        "gpuci from the leased GPUs; remove it",
        "repo/.gpuci.yml:11: aproval_label: unknown key 'aproval_label'; "
        "did you mean 'approval_label'?",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {gpus: 1}\n",
        "version: 1\nbatches:\n  a: {gpus: 1}\n  b: *a\n",
        "a: &a [1]\nb: [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b, *b]\n",
    ],
)
def test_anchors_and_aliases_are_refused(text: str) -> None:
    issues = issues_of(text)

    assert issues
    assert all("YAML anchors and aliases (&name, *name) are not supported" in i for i in issues)


def test_aliases_are_refused_at_their_line() -> None:
    text = "version: 1\nbatches:\n  a: {gpus: 1}\n  b: *unit\n"

    assert issues_of(text) == [
        ".gpuci.yml:4: YAML anchors and aliases (&name, *name) are not supported; "
        "write the values out"
    ]


def test_texts_over_one_mib_are_refused_before_parsing() -> None:
    text = "version: 1\n" + "# padding\n" * 110_000

    assert issues_of(text) == [".gpuci.yml: the file is over 1 MiB; a config is much smaller"]


# --- durations, sizes, names, cron -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("40m", 2400), ("6h", 21600), ("1h30m", 5400), ("1h30m15s", 5415),
     ("150m", 9000), ("90", 90), (45, 45), (" 2m ", 120)],
)  # fmt: skip
def test_parse_duration(text: str | int, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1d", "30m1h", "1.5h", "-5m", "0s", "0", 0, "1 h"])
def test_parse_duration_refuses(text: str | int) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(90, "1m30s"), (2400, "40m"), (21600, "6h"), (5400, "1h30m"), (5415, "1h30m15s"),
     (3601, "1h1s"), (0, "0s")],
)  # fmt: skip
def test_format_duration_reads_back(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text
    if seconds:
        assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "mib"),
    [("6GiB", 6144), ("512MiB", 512), ("1TiB", 1024 * 1024), ("96GB", 91552), ("80G", 76293),
     ("1.5GiB", 1536), ("2048M", 1953), ("6gib", 6144), ("6 GiB", 6144), ("1048576KiB", 1024)],
)  # fmt: skip
def test_parse_size_in_mib(text: str, mib: int) -> None:
    assert parse_size(text) == mib


@pytest.mark.parametrize("text", ["", "6", "GiB", "6 gigabytes", "-1GiB", "1KB", "6PiB"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"size|less than 1 MiB"):
        parse_size(text)


def test_natural_sort_orders_names_as_people_do() -> None:
    assert natural_sort(["10", "gemini", "4a", "2", "4", "11", "02"]) == [
        "02", "2", "4", "4a", "10", "11", "gemini",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "expression",
    ["0 16 * * 6", "*/15 * * * *", "0 0 1,15 * 1-5", "5 4 * * 7", "0 0-23/2 * 1-12/3 0"],
)
def test_valid_cron_expressions(expression: str) -> None:
    assert cron_problem(expression) is None


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("* * * *", "needs 5 fields"),
        ("* * * * * *", "needs 5 fields"),
        ("60 * * * *", "minute field '60': '60' is outside 0-59"),
        ("0 0 0 * *", "day of month field '0': '0' is outside 1-31"),
        ("0 0 * 13 *", "month field '13'"),
        ("0 0 * * 8", "day of week field '8'"),
        ("0 5-1 * * *", "range '5-1' runs backwards"),
        ("*/0 * * * *", "step in '*/0' must be at least 1"),
        ("0 0 * * mon", "'mon' is not *, */n, a, a-b or a-b/n"),
        ("0 0 * * 1,", "'' is not *"),
    ],
)
def test_invalid_cron_expressions(expression: str, problem: str) -> None:
    assert problem in (cron_problem(expression) or "")


# --- host inventories ------------------------------------------------------------------------

HOSTS_JSON = """\
{
  "h20-01": [
    {"index": 0, "name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0",
     "uuid": "GPU-1", "idle": true, "reasons": []},
    {"name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0"}
  ],
  "t4": [{"name": "Tesla T4", "memory_mb": 15360, "compute_capability": 7.5}]
}
"""
H20 = HostGpu("NVIDIA H20", 91552, (9, 0))
T4 = HostGpu("Tesla T4", 15360, (7, 5))
HOSTS = {"h20-01": [H20, H20], "t4": [T4]}


def test_load_hosts_reads_the_inventory_and_ignores_extra_keys() -> None:
    assert load_hosts(HOSTS_JSON, "hosts.json") == HOSTS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": [}', ["hosts.json:1: invalid JSON: Expecting value"]),
        ('["h20-01"]', ['hosts.json: expected an object of host name -> list of GPUs, '
                        'e.g. {"h20-01": [...]}']),
        ('{\n"a": 3\n}', ["hosts.json:2: a: expected a list of GPUs, found a number"]),
        ('{\n"a": [\n  "H20"\n]}', ["hosts.json:3: a[0]: expected a GPU object, found a string"]),
        ('{"a": [{"name": "X", "memory_gb": 0, "compute_capability": "8.0"}]}',
         ['hosts.json:1: a[0]: each GPU needs "memory_gb" or "memory_mb", a number above 0']),
        ('{"a": [{"name": "", "memory_gb": 1, "compute_capability": "eight"}]}',
         ['hosts.json:1: a[0]: each GPU needs "name", e.g. "NVIDIA H20"',
          'hosts.json:1: a[0]: each GPU needs "compute_capability", e.g. "9.0"']),
        ('{\n\t"a": [],\n\t"b": [\n\t\t{"name": "X", "memory_gb": 1}\n\t]\n}',
         ['hosts.json:4: b[0]: each GPU needs "compute_capability", e.g. "9.0"']),
    ],
)  # fmt: skip
def test_load_hosts_reports_located_issues(text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_hosts(text, "hosts.json")

    assert [str(i) for i in caught.value.issues] == expected


@pytest.mark.parametrize(
    ("body", "gpu", "matches"),
    [
        ("gpus: 1", T4, True),
        ("gpus: 1, gpu_model: H20", H20, True),
        ("gpus: 1, gpu_model: h20", H20, True),
        ("gpus: 1, gpu_model: H20", HostGpu("NVIDIA H200", 143771, (9, 0)), False),
        ("gpus: 1, gpu_model: A100", HostGpu("NVIDIA A100-SXM4-80GB", 81920, (8, 0)), True),
        ("gpus: 1, gpu_model: RTX 4090", HostGpu("NVIDIA GeForce RTX 4090", 24564, (8, 9)), True),
        ("gpus: 1, min_memory: 96GB", H20, True),
        ("gpus: 1, min_memory: 96GiB", H20, False),
        ("gpus: 1, min_compute_capability: '8.0'", T4, False),
        ("gpus: 1, min_compute_capability: '7.5'", T4, True),
        ("gpus: 1, gpu_model: H20, min_compute_capability: '9.0', min_memory: 80GiB", H20, True),
    ],
)
def test_gpu_matches(body: str, gpu: HostGpu, matches: bool) -> None:
    assert gpu_matches(one_batch(body), gpu) is matches


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("gpus: 2", None),
        ("gpus: 0, tests: [cpu]", None),
        ("gpus: 3", "batch b needs 3 GPUs; the largest host, h20-01, has 2"),
        ("gpus: 1, min_compute_capability: '9.0'", None),
        ("gpus: 2, min_compute_capability: '8.0', gpu_model: T4",
         "batch b needs 2 GPUs with model T4 and compute capability >= 8.0; best host h20-01 has "
         "2 GPUs, 0 of them with model T4 and compute capability >= 8.0"),
        ("gpus: 1, min_memory: 100GiB",
         "batch b needs 1 GPU with at least 100GiB memory; best host h20-01 has 2 GPUs, "
         "0 of them with at least 100GiB memory"),
        ("gpus: 1, gpu_model: T4", None),
        ("gpus: 2, gpu_model: T4",
         "batch b needs 2 GPUs with model T4; best host t4 has 1 GPU, 1 of them with model T4"),
    ],
)  # fmt: skip
def test_why_unrunnable(body: str, reason: str | None) -> None:
    assert why_unrunnable(one_batch(body), HOSTS) == reason


def test_why_unrunnable_with_an_empty_inventory() -> None:
    assert why_unrunnable(one_batch("gpus: 1"), {}) == (
        "batch b needs 1 GPU; the inventory has no hosts"
    )


def test_check_hosts_locates_each_unrunnable_batch_at_its_line() -> None:
    config = load_config(DESIGN_EXAMPLE)
    one_gpu_hosts = {"t4": [T4], "h20-01": [H20]}

    assert check_hosts(config.batches, config.lines, one_gpu_hosts, ".gpuci.yml") == [
        ConfigIssue(".gpuci.yml", 11, "batches.5", "batch 5 needs 2 GPUs; the largest host, "
                    "h20-01, has 1"),
        ConfigIssue(".gpuci.yml", 12, "batches.10", "batch 10 needs 8 GPUs with compute "
                    "capability >= 8.0; best host h20-01 has 1 GPU, 1 of them with compute "
                    "capability >= 8.0"),
        ConfigIssue(".gpuci.yml", 14, "batches.11", "batch 11 needs 2 GPUs; the largest host, "
                    "h20-01, has 1"),
    ]  # fmt: skip
    assert check_hosts(config.batches, config.lines, {"h20-01": [H20] * 8}, ".gpuci.yml") == []


# --- `gpuci config check` --------------------------------------------------------------------


def test_check_file_valid_config_and_hosts(tmp_path: Path) -> None:
    config = tmp_path / ".gpuci.yml"
    config.write_text(DESIGN_EXAMPLE)
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps({"big": [{"name": "NVIDIA H20", "memory_gb": 96,
                                          "compute_capability": "9.0"}] * 8}))  # fmt: skip

    assert check_file(config) == []
    assert check_file(config, hosts) == []


def test_check_file_reports_config_and_host_issues_together(tmp_path: Path) -> None:
    config = tmp_path / ".gpuci.yml"
    config.write_text(DESIGN_EXAMPLE.replace("timeout: 40m", "timeout: 40 minutes"))
    hosts = tmp_path / "hosts.json"
    hosts.write_text(HOSTS_JSON)
    batch_10 = (
        f"{config}:12: batches.10: batch 10 needs 8 GPUs with compute capability >= 8.0; "
        "best host h20-01 has 2 GPUs, 2 of them with compute capability >= 8.0"
    )

    assert [str(i) for i in check_file(config, hosts)] == [
        f"{config}:10: batches.2.timeout: '40 minutes' is not a duration; "
        "write e.g. 90s, 40m, 6h or 1h30m",
        batch_10,
    ]
    config.write_text(DESIGN_EXAMPLE)
    assert [str(i) for i in check_file(config, hosts)] == [batch_10]


EIGHT_H20_JSON = json.dumps(
    {"h20-01": [{"name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0"}] * 8}
)


def test_check_file_lists_the_issue_example_in_full(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "version: 1\n"
        "batches:\n"
        '  "2": {gpus: 16, tests: [tests], timout: 40m}\n'
        "layers:\n"
        '  "2": {batches: ["7"], trigger: pull_request}\n'
    )
    hosts = tmp_path / "hosts.json"
    hosts.write_text(EIGHT_H20_JSON)

    assert [str(i) for i in check_file(bad, hosts)] == [
        f"{bad}:3: batches.2.timout: unknown key 'timout'; did you mean 'timeout'?",
        f"{bad}:3: batches.2: batch 2 needs 16 GPUs; the largest host, h20-01, has 8",
        f"{bad}:5: layers.2.batches[0]: layer 2 names batch 7, which is not defined; "
        "defined batches: 2",
    ]


TOO_BIG = "batch b needs 16 GPUs; the largest host, h20-01, has 8"


@pytest.mark.parametrize(
    ("text", "host_issue"),
    [
        # other keys of the batch are wrong: its gpus and GPU constraints still say where it fits
        (BASE + "  b: {gpus: 16, timout: 5m}\n", TOO_BIG),
        (BASE + "  b: {gpus: 16, tests: [/abs/t.py], env: {CUDA_VISIBLE_DEVICES: '0'}}\n",
         TOO_BIG),
        (BASE + "  b: {gpus: 16, workers: auto}\n", TOO_BIG),
        (BASE + "  b: {gpus: 8, min_compute_capability: '10.0', pytest_args: [-n, '2']}\n",
         "batch b needs 8 GPUs with compute capability >= 10.0; best host h20-01 has 8 GPUs, "
         "0 of them with compute capability >= 10.0"),
        ("batches:\n  b: {gpus: 16}\n", TOO_BIG),  # version missing
        (BASE + "  b: {gpus: 16}\nlayers: {l: {batches: [c]}}\n", TOO_BIG),
        (BASE + "  b c: {gpus: 16}\n", "batch b c needs 16 GPUs; the largest host, h20-01, has 8"),
        # what decides where it fits is unreadable: not checked
        (BASE + "  b: {gpus: sixteen}\n", None),
        (BASE + "  b: {tests: [t]}\n", None),
        (BASE + "  b: {gpus: 16, min_memory: 80}\n", None),
        (BASE + "  b: {gpus: 16, gpu_model: ''}\n", None),
        (BASE + "  b: {gpus: 16, min_compute_capability: eight}\n", None),
        (BASE + "  b: [gpus, 16]\n", None),
        ("version: 1\nbatches: {b: {gpus: 16}\n", None),  # YAML syntax error
        ("version: 1\nbatches:\n  b: &a {gpus: 16}\n", None),  # refused before reading
    ],
)  # fmt: skip
def test_check_file_fits_every_batch_whose_size_could_be_read(
    tmp_path: Path, text: str, host_issue: str | None
) -> None:
    config = tmp_path / ".gpuci.yml"
    config.write_text(text)
    hosts = tmp_path / "hosts.json"
    hosts.write_text(EIGHT_H20_JSON)

    issues = check_file(config, hosts)
    config_issues = issues_of(text)

    assert config_issues  # every case has problems of its own
    fits = [i.message for i in issues if "host" in i.message]
    assert fits == ([host_issue] if host_issue else [])
    assert sorted(str(i).split(": ", 1)[1] for i in issues if i.message != host_issue) == sorted(
        i.split(": ", 1)[1] for i in config_issues
    )
    assert [i.line or 0 for i in issues] == sorted(i.line or 0 for i in issues)


def test_check_file_reports_inventory_and_config_errors_together(tmp_path: Path) -> None:
    config = tmp_path / ".gpuci.yml"
    config.write_text(BASE + "  b: {gpus: 16, timout: 5m}\n")
    hosts = tmp_path / "hosts.json"
    hosts.write_text('{"h20-01": [{"name": "NVIDIA H20", "memory_gb": 96}]}')

    assert [str(i) for i in check_file(config, hosts)] == [
        f"{config}:4: batches.b.timout: unknown key 'timout'; did you mean 'timeout'?",
        f'{hosts}:1: h20-01[0]: each GPU needs "compute_capability", e.g. "9.0"',
    ]
    assert [str(i) for i in check_file(config, tmp_path / "none.json")] == [
        f"{config}:4: batches.b.timout: unknown key 'timout'; did you mean 'timeout'?",
        f"{tmp_path / 'none.json'}: cannot read the file: No such file or directory",
    ]
    config.unlink()
    assert [str(i) for i in check_file(config, hosts)] == [
        f"{config}: cannot read the file: No such file or directory",
        f'{hosts}:1: h20-01[0]: each GPU needs "compute_capability", e.g. "9.0"',
    ]


def test_check_file_reports_unreadable_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yml"
    binary = tmp_path / "binary.yml"
    binary.write_bytes(b"version: 1\n\xff\xfe")
    config = tmp_path / ".gpuci.yml"
    config.write_text(DESIGN_EXAMPLE)

    assert check_file(missing) == [
        ConfigIssue(str(missing), None, "", "cannot read the file: No such file or directory")
    ]
    assert check_file(binary) == [
        ConfigIssue(str(binary), None, "", "the file is not UTF-8 text; save it as UTF-8")
    ]
    assert check_file(config, tmp_path / "hosts.json") == [
        ConfigIssue(str(tmp_path / "hosts.json"), None, "",
                    "cannot read the file: No such file or directory")
    ]  # fmt: skip


def test_check_file_reports_huge_files_and_bad_inventories(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yml"
    huge.write_text("# padding\n" * 110_000)
    config = tmp_path / ".gpuci.yml"
    config.write_text(DESIGN_EXAMPLE)
    hosts = tmp_path / "hosts.json"
    hosts.write_text('{"h20-01": [{"name": "NVIDIA H20"}]}')

    assert check_file(huge) == [
        ConfigIssue(str(huge), None, "", "the file is over 1 MiB; is it the right file?")
    ]
    assert [str(i) for i in check_file(config, hosts)] == [
        f'{hosts}:1: h20-01[0]: each GPU needs "memory_gb" or "memory_mb", a number above 0',
        f'{hosts}:1: h20-01[0]: each GPU needs "compute_capability", e.g. "9.0"',
    ]


def test_config_module_does_no_service_io() -> None:
    tree = ast.parse(Path(contract.config.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}  # fmt: skip
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}  # fmt: skip

    assert not imported & {"flask", "redis", "rq", "github", "subprocess", "requests"}


# --- runtimes ----------------------------------------------------------------------------------

RUNTIMES_EXAMPLE = """\
version: 1
runtime: torch                      # the default profile of every batch
runtimes:
  torch:                            # ColossalAI-like: a qualified stack the host provides
    base: torch2.13-cu13.0
    setup: ["pip install -e . --no-deps"]
    env: {TORCH_CUDA_ARCH_LIST: "9.0"}
    expect: {python: "3.11", torch: "2.13", cuda: "13.0"}
    caches: [huggingface, torch-extensions]
  trl:                              # TRL-like: the project's CUDA image
    image: pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime
    setup: pip install -e .[test]
    caches: {huggingface: 50GiB, packages: null}
    network: none
batches:
  "2": {gpus: 1, tests: [tests/test_optimizer]}
  trl: {gpus: 2, runtime: trl}
  offline: {gpus: 1, network: none}
"""


def test_runtime_profiles_load_exactly() -> None:
    config = load_config(RUNTIMES_EXAMPLE)

    assert config.default_runtime == "torch"
    assert config.runtimes == {
        "default": Runtime("default"),
        "torch": Runtime(
            "torch",
            base="torch2.13-cu13.0",
            setup=("pip install -e . --no-deps",),
            env={"TORCH_CUDA_ARCH_LIST": "9.0"},
            expect={"python": "3.11", "torch": "2.13", "cuda": "13.0"},
            caches={"huggingface": None, "torch-extensions": None},
        ),
        "trl": Runtime(
            "trl",
            image="pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
            setup=("pip install -e .[test]",),
            caches={"huggingface": 50 * 1024, "packages": None},
            network="none",
        ),
    }
    assert config.runtime_for(config.batches["2"]).name == "torch"
    assert config.runtime_for(config.batches["trl"]).requirement == "image"
    offline = config.runtime_for(config.batches["offline"])
    assert (offline.name, offline.network, offline.requirement) == (
        "torch",
        "none",
        "base:torch2.13-cu13.0",
    )


def test_todays_runtime_form_is_the_default_base_with_setup() -> None:
    config = load_config(BASE + "runtime: {setup: [make deps]}\n")

    runtime = config.runtime_for(config.batches["unit"])
    assert runtime == Runtime("default", setup=("make deps",))
    assert runtime.requirement == "base:default"
    assert config.setup == ("make deps",)


RUNTIME_ERRORS = [
    (BASE + "runtimes: {t: {base: b1, image: img}}\n",
     ".gpuci.yml:4: runtimes.t.image: a runtime has either base (a Python environment the GPU "
     "host provides) or image (a container), not both; remove one"),
    (BASE + "runtimes: {t: {caches: [hugingface]}}\n",
     ".gpuci.yml:4: runtimes.t.caches[0]: unknown cache 'hugingface'; did you mean "
     "'huggingface'?"),
    (BASE + "runtimes: {t: {caches: {pip: 1GiB}}}\n",
     ".gpuci.yml:4: runtimes.t.caches.pip: unknown cache 'pip'; caches are packages, "
     "huggingface, torch-hub, torch-extensions, triton"),
    (BASE + "runtimes: {t: {network: off}}\n",
     ".gpuci.yml:4: runtimes.t.network: expected host or none, found 'off'"),
    (BASE + "runtimes: {t: {network: lan}}\n",
     ".gpuci.yml:4: runtimes.t.network: network 'lan' is not host (the host's network) or none "
     "(no network)"),
    (BASE + "runtimes: {t: {expect: {torch: latest}}}\n",
     ".gpuci.yml:4: runtimes.t.expect.torch: 'latest' is not a version; write e.g. \"3.11\", "
     "\"2.13\" or \"13.0\""),
    (BASE + "runtimes: {t: {expect: {numpy: '2.0'}}}\n",
     ".gpuci.yml:4: runtimes.t.expect.numpy: unknown key 'numpy'; valid keys are cuda, python, "
     "torch"),
    (BASE + "runtimes: {t: {image: 'not an image'}}\n",
     ".gpuci.yml:4: runtimes.t.image: 'not an image' is not an image reference; write e.g. "
     "pytorch/pytorch:2.13"),
    ("version: 1\nruntimes: {t: {}}\nbatches:\n  unit: {gpus: 1, runtime: torch}\n",
     ".gpuci.yml:4: batches.unit.runtime: batch unit names runtime 'torch', which is not defined "
     "in runtimes; defined: default, t"),
    ("version: 1\nruntime: {setup: x}\nruntimes: {default: {}}\nbatches: {u: {gpus: 1}}\n",
     ".gpuci.yml:2: runtime: runtimes also defines 'default'; name the default (runtime: NAME) or "
     "rename that profile"),
    (BASE + "runtimes: {t: {}}\nruntime: tourch\n",
     ".gpuci.yml:5: runtime: the default runtime names runtime 'tourch', which is not defined in "
     "runtimes; defined: t"),
    (BASE + "runtimes: {'t t': {}}\n",
     ".gpuci.yml:4: runtimes.t t: runtime name 't t' may use only letters, digits, '.', '_', '-'"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), RUNTIME_ERRORS)
def test_each_runtime_error_is_located(text: str, expected: str) -> None:
    assert issues_of(text) == [expected]


def test_a_version_keeps_its_spelling() -> None:
    config = load_config(BASE + "runtimes: {t: {expect: {torch: 2.10, cuda: 13.0}}}\n")

    assert config.runtimes["t"].expect == {"torch": "2.10", "cuda": "13.0"}


def test_config_check_names_each_batch_whose_runtime_no_host_provides(tmp_path: Path) -> None:
    config = tmp_path / ".gpuci.yml"
    config.write_text(RUNTIMES_EXAMPLE)
    gpu = {"name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0"}
    hosts = tmp_path / "hosts.json"
    hosts.write_text(
        json.dumps(
            {
                "plain-01": [gpu] * 8,  # today's form: the default base only
                "torch-01": {
                    "gpus": [gpu] * 8,
                    "runtimes": ["base:default", "base:torch2.13-cu13.0"],
                },
            }
        )
    )

    issues = [str(i) for i in check_file(config, hosts)]

    assert issues == [
        f"{config}:17: batches.trl: batch trl uses runtime trl, which needs a container engine; "
        "no host in the inventory provides it (hosts list theirs with gpuci gpus --json "
        "--runtimes)"
    ]


def test_an_inventory_host_may_be_an_object_with_its_gpus() -> None:
    gpu = {"name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0"}
    text = json.dumps({"h": {"gpus": [gpu], "runtimes": ["image"]}, "old": [gpu]})

    assert load_hosts(text, "hosts.json") == {"h": [H20], "old": [H20]}
    assert inventory_runtimes(text) == {"h": {"image"}, "old": {"base:default"}}


def test_every_whole_config_in_the_docs_loads_or_fails_as_shown() -> None:
    """A config in docs/config.md loads, unless the docs show `gpuci config check` refusing it:
    then loading it reports those problems (the hosts' ones need --hosts)."""
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "config.md").read_text()
    checked = 0
    for part in text.split("```yaml\n")[1:]:
        block, after = part.split("```", 1)
        if not block.startswith("version: 1"):
            continue
        checked += 1
        shown = after.split("```", 2)[1] if after.startswith("\n\n```\n$ gpuci config") else ""
        if not shown:
            load_config(block, "docs/config.md")
            continue
        with pytest.raises(ConfigError) as refused:
            load_config(block, "bad.yml")
        found = [str(i) for i in refused.value.issues]
        expected = [line for line in shown.splitlines() if line.startswith("bad.yml:")]
        assert found == [line for line in expected if "needs" not in line]
    assert checked >= 3  # the full example, the refused one and the runtimes one
