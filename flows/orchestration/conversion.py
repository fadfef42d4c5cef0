"""Conversion: caption every image of an image-text dataset with a multimodal LLM, write BEIR files.

Output per (captioning model, dataset), as evalscope lays it out::

    <output_dir>/<model>/<dataset>/retrieval_data/{corpus.jsonl, queries.jsonl, qrels.jsonl, qrels/<split>.tsv}
    <output_dir>/<model>/<dataset>_image_caption.json

A conversion in which some images failed writes what it has beside those, as ``retrieval_data.incomplete`` and
``<dataset>_image_caption.incomplete.json``: the result files are only ever replaced by a complete conversion. Running
it again asks only for the failed images (the others come from the caption cache).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from clipcache.flows.config.convert_params import ConvertParams
from clipcache.flows.orchestration.stages import Stages
from clipcache.storage.caption_cache import CaptionCache
from clipcache.storage.naming import path_component
from clipcache.storage.results import write_json
from clipcache.tasks.convert.beir import BeirCounts, write_beir
from clipcache.tasks.convert.captioner import CaptionSettings, caption_images
from clipcache.tasks.evaluation.base import DataSource
from clipcache.tasks.evaluation.common import open_for
from clipcache.tasks.progress import StageProgress


def caption_dataset(dataset, settings: CaptionSettings, api_key: str, cache_dir: str, progress: StageProgress):
    cache = CaptionCache(cache_dir, settings.cache_setup())
    images = (dataset.load_image(i) for i in range(len(dataset)))
    return caption_images(images, len(dataset), settings, api_key=api_key, cache=cache, progress=progress,
                          label=dataset.name)


def intact_conversion(result_path: Path, folder: Path, model_name: str, split: str) -> bool:
    """``--skip_existing``: a complete conversion by this model whose BEIR folder still reads back with the counts its
    result file recorded. A damaged or partial folder is converted again (captions come from the caption cache)."""
    import json

    from clipcache.storage.errors import ClipcacheError
    from clipcache.tasks.datasets.beir import read_beir

    try:
        saved = json.loads(result_path.read_text(encoding="utf-8"))
        metrics = saved["metrics"]
        if saved.get("model") != model_name or not metrics.get("conversion_successful"):
            return False
        corpus, queries, _ = read_beir(folder, split)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ClipcacheError):
        return False
    return (len(corpus), len(queries)) == (metrics.get("n_corpus"), metrics.get("n_queries"))


def run_conversion(params: ConvertParams, stages: Stages) -> list[dict[str, Any]]:
    """Caption images into BEIR text-retrieval folders; returns evalscope-style result dicts."""
    progress = StageProgress(enabled=params.verbose)
    results: list[dict[str, Any]] = []
    for i, spec in enumerate(params.models):
        api_key = spec.resolved_api_key(f"models.{i}.api_key")
        settings = CaptionSettings(spec.model_name, spec.api_base, spec.prompt, spec.max_tokens, spec.temperature,
                                   spec.timeout, spec.concurrency, spec.max_retries,
                                   stall_timeout=spec.stall_timeout)
        for name in params.datasets:
            base = Path(params.output_dir) / spec.folder
            stem = path_component(name)
            result_path = base / f"{stem}_image_caption.json"
            folder = base / stem / "retrieval_data"
            if params.skip_existing and intact_conversion(result_path, folder, spec.model_name, params.split):
                results.append({"dataset": name, "model": spec.model_name, "task": "image_caption",
                                "status": "skipped"})
                continue
            where = f"{spec.folder}-{stem}"
            source = DataSource(name, params.dataset_root, params.split, params.limit, params.hub, params.cache_dir,
                                params.offline)
            # captions + queries need an image-text dataset
            dataset = stages.run("open-dataset", f"open-{name}", open_for, "zeroshot_retrieval", source, progress)
            run = stages.run("caption", f"caption-{where}", caption_dataset, dataset, settings, api_key,
                             params.cache_dir, progress)
            # A conversion with failed images is not the result: it goes beside it (retrieval_data.incomplete),
            # so a good earlier folder is never replaced by a worse one, and nothing empty poses as a result.
            complete = not run.failures
            target = folder if complete else folder.with_name("retrieval_data.incomplete")
            n_captioned = len(dataset) - len(run.failures)
            counts = BeirCounts(0, 0, 0)
            if n_captioned:
                counts = stages.run("write-beir", f"write-beir-{where}", write_beir, target, run.captions,
                                    dataset.captions or [], params.split)  # open_for: a retrieval set has them
            metrics = {
                "conversion_successful": complete, "n_images": len(dataset),
                "n_captioned": n_captioned, "n_failed": len(run.failures),
                "failed": [{"image": dataset.describe(idx), "error": err} for idx, err in run.failures],
                "n_corpus": counts.corpus, "n_queries": counts.queries, "api_calls": run.api_calls,
                "from_cache": run.from_cache, "from_other_runs": run.from_peers, "stalled": run.stalled,
                "save_path": str(target) if n_captioned else None,
            }
            payload = {"dataset": name, "model": spec.model_name, "task": "image_caption", "metrics": metrics}
            report = result_path if complete else result_path.with_name(f"{stem}_image_caption.incomplete.json")
            write_json(report, payload)
            if complete:  # what an earlier, incomplete attempt left beside the result is superseded
                shutil.rmtree(folder.with_name("retrieval_data.incomplete"), ignore_errors=True)
                report.with_name(f"{stem}_image_caption.incomplete.json").unlink(missing_ok=True)
            results.append(payload)
    return results

