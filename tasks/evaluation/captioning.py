"""Captioning (clip_benchmark's ``--task captioning``): the images of an image-text dataset (mscoco_captions,
flickr30k, flickr8k, a custom or wds retrieval set) get one caption each, scored against the dataset's reference
captions with the COCO caption metrics (pycocoevalcap) and, on request, CLIPScore / RefCLIPScore from the embedding
cache (definitions in tasks/score/caption_metrics.py).

Where the captions come from (``caption_source``, tasks/evaluation/caption_sources.py): by default the model
writes them (open_clip CoCa, ``model.generate``, clip_benchmark's decoding); ``cache:<key prefix>`` reads a
captioning setup in the cache, such as the captions a VLM wrote through ``convert``; a file path reads a user's
captions. Captions are cached, so a rescore with other metrics or references generates nothing and calls no API;
only CLIPScore reads embeddings, of the images and of the prefixed captions and references (text entries keyed by
their content), made by the run's model.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from clipcache.tasks.contract import CacheMissError, SampleUnit, TaskOptions
from clipcache.tasks.evaluation.base import (
    DataSource,
    Encoded,
    EncodeSession,
    EncodeSettings,
    EvalTask,
    MetricInfo,
    Prepared,
    PromptSettings,
    Scored,
    ScoreSettings,
)

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.base import EvalDataset
    from clipcache.tasks.evaluation.caption_sources import CaptionOutcome
    from clipcache.tasks.progress import StageProgress

CaptionMetric = Literal["bleu", "meteor", "rouge", "cider", "spice", "clipscore"]


class Captioning(EvalTask["EvalDataset"]):
    name = "captioning"
    short = "captioning"
    description = ("Bleu_1..4, METEOR, ROUGE_L, CIDEr, SPICE (pycocoevalcap) of one caption per image against "
                   "the references; clipscore / refclipscore on request")
    needs = ("image", "caption_text")
    reads = ("retrieval",)
    main_metrics = (("CIDEr", None, "CIDEr", 1),)
    metrics = (
        # tasks/score/caption_metrics.py: pycocoevalcap's names, as clip_benchmark's captioning JSON has them
        *[MetricInfo(f"Bleu_{n}", True, False, f"captioning: corpus BLEU-{n} of the PTB-tokenised captions against the "
                                              f"references (pycocoevalcap)") for n in range(1, 5)],
        MetricInfo("METEOR", True, False, "captioning: METEOR 1.5 of the PTB-tokenised captions (pycocoevalcap's Java "
                                          "scorer, its corpus aggregate)"),
        MetricInfo("ROUGE_L", True, False, "captioning: mean over images of ROUGE-L (LCS F-measure, beta 1.2, best "
                                           "reference)"),
        MetricInfo("CIDEr", True, False, "captioning: mean over images of CIDEr-D (TF-IDF n-gram cosine to the "
                                         "references, document frequencies from the evaluated set)"),
        MetricInfo("SPICE", True, False, "captioning: mean over images of SPICE's scene-graph tuple F-score"),
        MetricInfo("clipscore", True, False, "captioning: mean over images of 2.5 * max(cos(image, 'A photo depicts ' "
                                             "+ caption), 0) (Hessel et al. 2021)"),
        MetricInfo("refclipscore", True, False, "captioning: mean over images of the harmonic mean of CLIPScore and "
                                                "the caption's largest cosine to a prefixed reference (Hessel et al. "
                                                "2021)"),
    )
    samples = (
        SampleUnit("caption_<metric>", ("value", "caption", "reference_captions"), "an image: the metric's "
                                                                                   "per-image value, its caption "
                                                                                   "and references",
                   recomputes="`CIDEr`, `ROUGE_L`, `SPICE`, `clipscore`, `refclipscore` = `avg(value)` of their unit "
                              "(`caption_cider`, `caption_rouge_l`, ...); corpus BLEU and METEOR are not means of "
                              "their rows (docs/captioning.md)"),
        SampleUnit("caption", ("caption", "reference_captions"), "an image's caption and references (no metric "
                                                                 "with per-image values was asked for)"),
    )

    class Options(TaskOptions):
        encode_fields = ("caption_source", "caption_generation", "caption_seq_len", "caption_top_p",
                         "caption_top_k", "caption_temperature")

        caption_source: str | None = Field(None, description="where the captions come from: the model writes them "
                                           "(default; open_clip CoCa), cache:<key prefix> (a captioning setup in "
                                           "the cache, e.g. convert's), or a captions file (.json/.jsonl)")
        caption_references: str | None = Field(None, description="a references file (.json/.jsonl) replacing "
                                               "the dataset's captions as references")
        caption_metrics: tuple[CaptionMetric, ...] = Field(
            ("bleu", "meteor", "rouge", "cider", "spice"), min_length=1,
            description="metric families: bleu, meteor, rouge, cider, spice (clip_benchmark's), clipscore (CLIPScore "
            "and RefCLIPScore with the run's model)")
        # clip_benchmark calls generate() with its defaults (beam search), which open_clip 3.3.0 cannot run with
        # transformers 5; clipcache's beam search (caption_beam_search.py) stands in, greedy top-k is the default here
        caption_generation: Literal["top_k", "top_p", "beam_search"] = Field(
            "top_k", description="open_clip generate()'s generation_type (beam_search: open_clip's 6 beams in 3 "
            "groups, clipcache's implementation)")
        # open_clip's generate() asserts seq_len > min_seq_len (5: it forbids <end_of_text> before 5 tokens)
        caption_seq_len: int = Field(30, ge=6, le=76, description="open_clip generate()'s seq_len (6..76)")
        caption_top_p: float = Field(0.1, gt=0, le=1, description="open_clip generate()'s top_p (top_p sampling)")
        caption_top_k: int = Field(1, ge=1, description="open_clip generate()'s top_k (1: greedy decoding)")
        caption_temperature: float = Field(1.0, gt=0, description="open_clip generate()'s temperature")

        def decoding(self) -> dict[str, Any]:
            if self.caption_generation == "beam_search":  # open_clip's beam search ignores top_p/top_k/temperature
                from clipcache.tasks.evaluation.caption_beam_search import BEAM_DEFAULTS

                return {"generation_type": "beam_search", "seq_len": self.caption_seq_len, **BEAM_DEFAULTS}
            return {"generation_type": self.caption_generation, "seq_len": self.caption_seq_len,
                    "top_p": self.caption_top_p, "top_k": self.caption_top_k,
                    "temperature": self.caption_temperature}

    def options(self, settings: EncodeSettings | ScoreSettings) -> dict[str, Any]:
        """The changed options, plus the SHA-256 of a captions or references file: an edited file is another
        experiment, not a repetition of the one its path named before."""
        from pathlib import Path

        from clipcache.storage.hashing import sha256_file

        chosen = super().options(settings)
        for name in ("caption_source", "caption_references"):
            value = chosen.get(name)
            if value and not value.startswith("cache:") and Path(value).is_file():
                chosen[f"{name}_sha256"] = sha256_file(Path(value))
        return chosen

    def serves(self, role: str, kind: str) -> bool:
        return role == "caption_text" or (role == "image" and kind == "retrieval")

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared[EvalDataset]:
        from clipcache.tasks.evaluation.common import check_language, open_for

        dataset = open_for("zeroshot_retrieval", source, progress)
        check_language(dataset, prompts.language)
        return Prepared(dataset, len(dataset), source)

    def encode(self, session: EncodeSession, prepared: Prepared[EvalDataset], store: EmbeddingStore,
               memo: FileHashMemo, settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        from clipcache.tasks.score.caption_metrics import CLIPSCORE_PREFIX

        started = time.perf_counter()
        options = self.Options.of(settings)
        dataset, n = prepared.data, prepared.n_samples
        captions = self._captions(session, dataset, n, store, memo, options=options, settings=settings,
                                      progress=progress)
        outcomes: dict[str, Any] = {"captions": captions}
        references, ref_sha = self._references(dataset, n, options)
        if "clipscore" in options.caption_metrics:
            outcomes.update(_clip_entries(session, prepared, store, memo, settings=settings, progress=progress, texts=[
                ("candidate", [CLIPSCORE_PREFIX + c for c in captions.captions]),
                ("reference", [CLIPSCORE_PREFIX + r for refs in references for r in refs])]))
        return Encoded(outcomes, info={"references": references, "references_sha256": ref_sha},
                       seconds=time.perf_counter() - started)

    def _captions(self, session: EncodeSession, dataset: EvalDataset, n: int, store: EmbeddingStore,
                  memo: FileHashMemo, *, options: Captioning.Options, settings: EncodeSettings,
                  progress: StageProgress) -> CaptionOutcome:
        from pathlib import Path

        from clipcache.storage.caption_cache import CaptionCache, open_setup
        from clipcache.storage.errors import ConfigError
        from clipcache.storage.hashing import digest
        from clipcache.tasks.datasets.caption_files import read_captions
        from clipcache.tasks.evaluation.caption_sources import (
            CaptionOutcome,
            cached_captions,
            generate_missing,
            generation_setup,
            image_keys,
        )

        source = options.caption_source
        if source and not source.startswith("cache:"):
            texts, sha = read_captions(source, dataset, n)
            return CaptionOutcome(tuple(texts), {"file_sha256": sha})
        if getattr(store, "in_place", False):  # a remote cache (s3://, gs://): caption files are local only
            raise ConfigError(f"captioning keeps its captions beside a local cache_dir; {store.root} is remote "
                              f"(give a captions file with --caption_source, or a local --cache_dir)")
        cache_dir = Path(str(store.root))
        if source:
            cache = open_setup(cache_dir, source.removeprefix("cache:"))
        else:
            cache = CaptionCache(cache_dir, generation_setup(session, options.decoding()),
                                 create=not settings.cached_only, label=session.resolved.display_name)
        data_key = digest({"images": dataset.image_identity(memo), "split": dataset.split, "n": n})
        memo.save()
        keys = image_keys(dataset, n, cache_dir, data_key, progress)
        found = cached_captions(cache, keys)
        missing = sum(c is None for c in found)
        if missing and (source or settings.cached_only):
            where = f"captioning setup {cache.key[:12]} ({cache.setup.get('model', '?')})"
            raise CacheMissError([f"captions of {missing} of {n} images of {dataset.name} in {where}"])
        generated = generate_missing(session, dataset, cache, found, keys, decoding=options.decoding(),
                                     batch_size=settings.batch_size, progress=progress)
        return CaptionOutcome(tuple(c or "" for c in found), {"setup": cache.setup, "key": cache.key}, generated)

    def _references(self, dataset: EvalDataset, n: int,
                    options: Captioning.Options) -> tuple[list[list[str]], str | None]:
        from clipcache.storage.errors import DatasetError
        from clipcache.tasks.datasets.caption_files import read_references

        if options.caption_references:
            return read_references(options.caption_references, dataset, n)
        references = [list(c) for c in (dataset.captions or [])[:n]]
        if len(references) != n or not all(references):
            raise DatasetError(f"dataset {dataset.name!r}: captioning needs reference captions for every image "
                               f"(give them with --caption_references)")
        return references, None

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared[EvalDataset],
              settings: ScoreSettings) -> Scored:
        import numpy as np

        from clipcache.tasks.evaluation.common import sample_keys
        from clipcache.tasks.score.caption_scoring import score_captions

        started = time.perf_counter()
        options = self.Options.of(settings)
        keys = sample_keys(prepared.data, np.arange(prepared.n_samples))
        metrics, evidence = score_captions(store, encoded, list(options.caption_metrics), settings.bootstrap, keys)
        return Scored(metrics, prepared.n_samples, seconds=time.perf_counter() - started, evidence=evidence)


def _clip_entries(session: EncodeSession, prepared: Prepared[EvalDataset], store: EmbeddingStore,
                  memo: FileHashMemo, *, settings: EncodeSettings, progress: StageProgress,
                  texts: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """The image entry (shared with every task that reads the dataset's images) and one text entry per list of
    prefixed texts, keyed by the texts alone (role ``caption_text``), so the same captions or references scored on
    another dataset split or by another run share it."""
    from clipcache.storage.hashing import digest
    from clipcache.tasks.encode.stage import check_cached, encode_images, encode_texts, image_key_fields

    data = prepared.data
    image_fields = image_key_fields(session, data.image_identity(memo), data.split, prepared.source.limit)
    memo.save()
    text_fields = {name: {"role": "caption_text", "model": session.resolved.identity,
                          "precision": session.precision, "texts": digest(values)} for name, values in texts}
    if settings.cached_only:
        check_cached(store, [(image_fields, f"image embeddings of {data.name}"),
                             *((text_fields[name], f"{name} caption embeddings of {data.name}")
                               for name, _ in texts)])
    outcomes = {"image": encode_images(session, data, store, image_fields, settings, progress)}
    for name, values in texts:
        outcomes[name] = encode_texts(session, values, store, text_fields[name], kind="caption",
                                      batch_size=settings.batch_size, progress=progress, label=data.name,
                                      meta={"dataset": data.name, "split": data.split})
    return outcomes
