"""What makes an evaluation one experiment: the fields of its ``Experiment`` (clipcache.storage.experiment, whose
``id`` names its results everywhere), the options that make other vectors or other labels (GPU decoding, a replaced
annotation file), and the rule that a limit truncating nothing is the full experiment. The pipeline
(flows/orchestration/pipeline.py) calls these for every pair; the experiment ids of existing results depend on them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from clipcache.storage.experiment import MTEB_ROLES, Experiment, options_json
from clipcache.tasks.contract import EncodeSession, Prepared, PromptSettings, ScoreSettings
from clipcache.tasks.evaluation.base import EvalTask
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.progress import StageProgress


def experiment_for(spec: ModelSpec, session: EncodeSession, task: EvalTask, prepared: Prepared,
                   settings: ScoreSettings) -> Experiment:
    source = prepared.source
    return Experiment(
        model=spec.display_name, checkpoint=session.resolved.checkpoint, dataset=source.name,
        split=source.split, language=source.language, task=task.name, precision=session.precision,
        sample_limit=source.limit, prompts=prepared.prompts_sha256, default_prompts=prepared.default_prompts,
        options=options_json({**task.options(settings), **annotation_option(source.annotation_file),
                              **reader_option(prepared.data), **decode_option(session.decode, task),
                              **roles_option(session.resolved.text_roles, task)}),
        pretrained=session.resolved.checkpoint_label,
        model_dir=spec.basename)


def full_when_untruncated(task: EvalTask, prepared: Prepared, prompts: PromptSettings,
                          progress: StageProgress) -> Prepared:
    """A limit that truncates nothing (``limit: 1000`` on a 30-pair set) is the full experiment: the same cache
    entries, experiment id, file name and leaderboard row as a run without it. A reader stops at the limit, so a
    count equal to it is checked by indexing one sample more."""
    limit = prepared.source.limit
    if limit is None:
        return prepared
    if prepared.n_samples >= limit:
        probe = task.prepare(replace(prepared.source, limit=limit + 1), prompts, progress)
        if probe.n_samples > limit:
            return prepared
    return replace(prepared, source=replace(prepared.source, limit=None))


def reader_option(data: Any) -> dict[str, str]:
    """A dataset read otherwise than LAION clip_benchmark reads its name (InternVL's fork layout of Flickr30K, its
    captions cleaned) is another experiment; every other reading adds nothing, so existing experiment ids stay."""
    reader = getattr(data, "experiment_reader", None)
    return {"reader": reader} if isinstance(reader, str) and reader else {}


def decode_option(decode: str, task: EvalTask) -> dict[str, str]:
    """GPU decoding makes other image vectors, so another experiment (the default, cpu, adds nothing: existing
    experiment ids stay)."""
    images = any(role == "image" or role.endswith("_image") for role in task.needs)  # any2any, visual STS, ...
    return {"decode": decode} if decode != "cpu" and images else {}


def roles_option(text_roles: bool, task: EvalTask) -> dict[str, str]:
    """A task run through mteb (mieb:) embeds a retrieval task's queries as queries since mteb's prompt_type reaches
    the model; a model that embeds a query otherwise than a document (an ``api:`` model with roles or prefixes:
    ``ResolvedModel.text_roles``) got them as documents before, so its experiments are new ones. Every other model
    and task adds nothing: their vectors did not change, nor do their experiment ids. Still a reference experiment
    (storage/experiment.py: REFERENCE_OPTIONS)."""
    return dict(MTEB_ROLES) if text_roles and task.mteb_roles else {}


def annotation_option(path: str | None) -> dict[str, str]:
    """A replaced annotation file makes a different experiment: named by file name and content hash."""
    if not path:
        return {}
    from clipcache.storage.hashing import sha256_file

    return {"annotation_file": f"{Path(path).name}@{sha256_file(Path(path))[:12]}"}
