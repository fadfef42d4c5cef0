"""What `eval --suite` evaluates: the suite's datasets (those clipcache can read; `clipcache suite show` lists the
others), each with the task, split and language the suite lists it with. One run may mix splits and languages
(mieb_lite evaluates TinyImageNetClustering on valid and the others on test; internvl lists imagenet1k in five
languages), and each result is the experiment `eval --dataset D --split S --language L` makes, which is what
`clipcache suite score` reads."""

from __future__ import annotations

from typing import Any

from clipcache.flows.config.run_settings import Evaluation
from clipcache.storage.errors import ConfigError


def with_suite_datasets(data: dict[str, Any]) -> dict[str, Any]:
    """The run's parameters with the suite's datasets added after any --dataset. A --task, --split or --language
    given with a suite must agree with every dataset of the suite; left out, each dataset takes the suite's own."""
    from clipcache.tasks.datasets import default_task
    from clipcache.tasks.suites import load_suite

    suite = load_suite(data["suite"])
    if data.get("task", "auto") != "auto":
        raise ConfigError("task: a suite runs each of its datasets with the suite's own task; leave --task out (auto)")
    for e in suite.runnable():
        for what, value in (("split", e.split), ("language", e.language)):
            given = data.get(what)
            if given is not None and value != (given[0] if isinstance(given, list) and len(given) == 1 else given):
                raise ConfigError(f"{what}: suite {suite.name} evaluates {e.dataset} with {what} {value}, not "
                                  f"{given}; run it without --{what}")
    for e in suite.runnable():
        if e.task != "auto" and (own := default_task(e.dataset, data.get("dataset_root"))) != e.task:
            raise ConfigError(f"suite {suite.name}: {e.dataset} is listed with task {e.task}, but `eval --suite` runs "
                              f"each dataset's own task ({own})")
    names = [e.dataset for e in suite.runnable()]
    return {**data, "datasets": list(dict.fromkeys([*(data.get("datasets") or []), *names]))}


def evaluations(suite: str | None, datasets: list[str], split: str, languages: list[str]) -> list[Evaluation]:
    """Every (dataset, split, language) of a run, in order: a dataset of the suite with each split and language the
    suite lists it with (a dataset also given with --dataset too: the suite says how it counts), any other with
    ``split`` and each of ``languages``."""
    listed: dict[str, list[Evaluation]] = {}
    if suite:
        from clipcache.tasks.suites import load_suite

        for e in load_suite(suite).runnable():
            listed.setdefault(e.dataset, []).append(Evaluation(e.dataset, e.split, e.language))
    return [evaluation for name in datasets
            for evaluation in listed.get(name) or [Evaluation(name, split, language) for language in languages]]
