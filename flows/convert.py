"""The ``convert`` flow: caption every image of an image-text dataset with a multimodal LLM, write BEIR files.

Output per (captioning model, dataset), as evalscope lays it out::

    <output_dir>/<model>/<dataset>/retrieval_data/{corpus.jsonl, queries.jsonl, qrels.jsonl, qrels/<split>.tsv}
    <output_dir>/<model>/<dataset>_image_caption.json
"""

from __future__ import annotations

from pathlib import Path

from clipcache.flows import runtime

runtime.configure()

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from clipcache.flows.artifacts import publish_conversion  # noqa: E402
from clipcache.flows.convert_params import ConvertParams  # noqa: E402
from clipcache.storage.caption_cache import CaptionCache  # noqa: E402
from clipcache.storage.results import write_json  # noqa: E402
from clipcache.tasks import prefect_tasks as t  # noqa: E402
from clipcache.tasks.convert.beir import write_beir  # noqa: E402
from clipcache.tasks.convert.captioner import CaptionSettings, caption_images  # noqa: E402
from clipcache.tasks.progress import StageProgress  # noqa: E402
from clipcache.tasks.results import dataset_slug  # noqa: E402


@task(name="caption", cache_policy=NO_CACHE)
def caption_dataset(dataset, settings: CaptionSettings, api_key: str, cache_dir: str, progress: StageProgress):
    cache = CaptionCache(cache_dir, settings.cache_setup())
    images = (dataset.load_image(i) for i in range(len(dataset)))
    return caption_images(images, len(dataset), settings, api_key, cache, progress, dataset.name)


write_beir_task = task(write_beir, name="write-beir", cache_policy=NO_CACHE)


@flow(name="convert", flow_run_name="convert-{params.datasets[0]}", validate_parameters=True, log_prints=False)
def convert(params: ConvertParams) -> list[dict]:
    """Caption images into BEIR text-retrieval folders; returns evalscope-style result dicts."""
    progress = StageProgress(enabled=params.verbose)
    results = []
    for i, spec in enumerate(params.models):
        api_key = spec.resolved_api_key(f"models.{i}.api_key")
        settings = CaptionSettings(spec.model_name, spec.api_base, spec.prompt, spec.max_tokens, spec.temperature,
                                   spec.timeout, spec.concurrency, spec.max_retries)
        for name in params.datasets:
            base = Path(params.output_dir) / spec.basename
            result_path = base / f"{dataset_slug(name)}_image_caption.json"
            if params.skip_existing and result_path.exists():
                results.append({"dataset": name, "model": spec.model_name, "task": "image_caption",
                                "status": "skipped"})
                continue
            dataset = t.open_dataset(name, params.dataset_root, params.split, params.limit, params.hub,
                                     params.cache_dir, params.offline, progress)
            t.select_task(dataset, "zeroshot_retrieval")  # captions + queries need an image-text dataset
            run = caption_dataset(dataset, settings, api_key, params.cache_dir, progress)
            folder = base / dataset_slug(name) / "retrieval_data"
            counts = write_beir_task(folder, run.captions, dataset.captions, params.split)
            metrics = {
                "conversion_successful": not run.failures, "n_images": len(dataset),
                "n_captioned": len(dataset) - len(run.failures), "n_failed": len(run.failures),
                "failed": [{"image": dataset.describe(idx), "error": err} for idx, err in run.failures],
                "n_corpus": counts.corpus, "n_queries": counts.queries, "api_calls": run.api_calls,
                "from_cache": run.from_cache, "save_path": str(folder),
            }
            payload = {"dataset": name, "model": spec.model_name, "task": "image_caption", "metrics": metrics}
            write_json(result_path, payload)
            results.append(payload)
    publish_conversion(results)
    return results
