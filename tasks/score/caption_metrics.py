"""Caption quality: the COCO caption metrics (through pycocoevalcap, the implementation clip_benchmark's captioning
task runs) and CLIPScore / RefCLIPScore (Hessel et al., EMNLP 2021) from cached embeddings.

COCO metrics, as clip_benchmark's ``metrics/captioning.py`` computes them: every candidate and reference caption is
PTB-tokenised (Stanford's PTBTokenizer, in Java), then scored by pycocoevalcap's BLEU-1..4, METEOR 1.5 (Java),
ROUGE-L, CIDEr-D and SPICE (Java, with Stanford CoreNLP models). The corpus values are pycocoevalcap's: BLEU is the
corpus BLEU (not the mean of the per-image values), METEOR the Java scorer's aggregate, ROUGE-L, CIDEr and SPICE the
means of their per-image values. SPICE needs the CoreNLP 3.6.0 jars that pycocoevalcap downloads from
nlp.stanford.edu on first use; where they are not installed, SPICE is left out with one line that says so.

CLIPScore and RefCLIPScore, the reference implementation's definitions (github.com/jmhessel/clipscore), on
L2-normalised vectors: texts are encoded with the prefix ``"A photo depicts "``; per image,
``CLIPScore = 2.5 * max(cos(image, candidate), 0)``, and
``RefCLIPScore = harmonic mean(CLIPScore, max over the image's references of cos(candidate, reference))``; the
reported values are the means over images. (Where both terms are 0 the reference implementation divides 0 by 0;
here that image's RefCLIPScore is 0, the harmonic mean's limit.)
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clipcache.storage.errors import ConfigError

log = logging.getLogger("clipcache.captioning")

# metric family -> the flat names pycocoevalcap (and clip_benchmark's result JSON) give its values
COCO_METRICS: dict[str, tuple[str, ...]] = {
    "bleu": ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"),
    "meteor": ("METEOR",),
    "rouge": ("ROUGE_L",),
    "cider": ("CIDEr",),
    "spice": ("SPICE",),
}
CLIP_METRICS: dict[str, tuple[str, ...]] = {"clipscore": ("clipscore", "refclipscore")}
CLIPSCORE_PREFIX = "A photo depicts "  # the reference implementation's prefix, with the space it adds
CLIPSCORE_W = 2.5
# corpus value = mean of the per-image values (so a bootstrap of the mean gives its interval); BLEU and METEOR are not
MEAN_OF_IMAGES = ("ROUGE_L", "CIDEr", "SPICE", "clipscore", "refclipscore")


@dataclass
class CaptionScores:
    metrics: dict[str, float]
    per_image: dict[str, np.ndarray] = field(default_factory=dict)  # metric -> (n_images,) float64
    skipped: dict[str, str] = field(default_factory=dict)  # metric family -> why it was left out


def java_problem() -> str | None:
    """Why pycocoevalcap's Java-based parts cannot run here (None when they can)."""
    try:
        import pycocoevalcap  # noqa: F401
    except ImportError:
        return ("the COCO caption metrics need pycocoevalcap (pip install 'clipcache[captioning]' or "
                "pip install pycocoevalcap==1.2)")
    if shutil.which("java") is None:
        return ("the COCO caption metrics need a Java runtime on PATH for PTB tokenisation and METEOR "
                "(Debian/Ubuntu: apt-get install default-jre-headless)")
    return None


def spice_problem() -> str | None:
    """Why SPICE cannot run here: pycocoevalcap downloads Stanford CoreNLP 3.6.0 on first use; offline it cannot."""
    from pycocoevalcap.spice import get_stanford_models as models

    lib = Path(models.__file__).parent / models.SPICELIB
    wanted = [lib / f"{models.JAR}.jar", lib / f"{models.JAR}-models.jar"]
    missing = [p.name for p in wanted if not p.is_file()]
    if missing:
        return (f"SPICE skipped: it needs Stanford CoreNLP ({', '.join(missing)} in {lib}), which pycocoevalcap "
                f"downloads from nlp.stanford.edu on first use; run `python -m pycocoevalcap.spice."
                f"get_stanford_models` where that host is reachable")
    return None


def check_families(families: Sequence[str]) -> None:
    known = (*COCO_METRICS, *CLIP_METRICS)
    bad = [f for f in families if f not in known]
    if bad:
        raise ConfigError(f"caption_metrics: unknown {', '.join(map(repr, bad))} (known: {', '.join(known)})")


def coco_caption_scores(references: Sequence[Sequence[str]], candidates: Sequence[str],
                        families: Sequence[str] = tuple(COCO_METRICS)) -> CaptionScores:
    """pycocoevalcap's metrics of ``candidates`` (one per image) against ``references`` (several per image), each
    image's texts PTB-tokenised first, as clip_benchmark's captioning evaluation does."""
    if len(references) != len(candidates):
        raise ValueError(f"{len(candidates)} candidates for {len(references)} images")
    wanted = [f for f in COCO_METRICS if f in families]
    scores = CaptionScores({})
    if not wanted or not candidates:
        return scores
    if problem := java_problem():
        raise ConfigError(problem)
    if "spice" in wanted and (problem := spice_problem()):
        log.warning("%s", problem)
        scores.skipped["spice"] = problem
        wanted.remove("spice")
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": t} for t in refs] for i, refs in enumerate(references)})
    res = tokenizer.tokenize({i: [{"caption": c}] for i, c in enumerate(candidates)})
    order = list(gts)  # the scorers' per-image values come in gts's key order
    for family in wanted:
        names = COCO_METRICS[family]
        scorer = _scorer(family)
        with contextlib.redirect_stdout(io.StringIO()):  # BLEU prints its length statistics
            corpus, per_image = scorer.compute_score(gts, res)
        if len(names) == 1:
            corpus, per_image = [corpus], [per_image]
        for name, value, values in zip(names, corpus, per_image, strict=True):
            scores.metrics[name] = float(value)
            by_position = np.empty(len(order), np.float64)
            by_position[order] = [_per_image_value(v) for v in values]
            scores.per_image[name] = by_position
    return scores


_meteor: Any = None


def shared_meteor() -> Any:
    """One METEOR scorer per process: its Java start loads paraphrase tables (tens of seconds on a loaded 2-core
    machine), so every scoring in a run shares it. pycocoevalcap's scorer serialises calls with its own lock."""
    global _meteor
    if _meteor is None or _meteor.meteor_p.poll() is not None:
        from pycocoevalcap.meteor.meteor import Meteor

        _meteor = Meteor()
        atexit.register(_close, _meteor)
    return _meteor


def _scorer(family: str) -> Any:  # pycocoevalcap has no type hints
    if family == "bleu":
        from pycocoevalcap.bleu.bleu import Bleu

        return Bleu(4)
    if family == "meteor":
        return shared_meteor()
    if family == "rouge":
        from pycocoevalcap.rouge.rouge import Rouge

        return Rouge()
    if family == "cider":
        from pycocoevalcap.cider.cider import Cider

        return Cider()
    from pycocoevalcap.spice.spice import Spice

    return Spice()


def _close(scorer: object) -> None:
    """Stop METEOR's Java process at exit rather than whenever the object is collected."""
    proc = getattr(scorer, "meteor_p", None)
    if proc is not None:
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()
            proc.kill()
            proc.wait()  # its own __del__ later closes and kills again: harmless on a finished process


def _per_image_value(value: object) -> float:
    """SPICE's per-image value is a dict of sub-scores (its F-score under All/f, as its corpus value)."""
    if isinstance(value, dict):
        return float(value["All"]["f"])
    return float(value)  # type: ignore[arg-type]


def clipscore(images: np.ndarray, candidates: np.ndarray, w: float = CLIPSCORE_W) -> np.ndarray:
    """Per image: ``w * max(cos(image, candidate), 0)`` of row-aligned vectors (normalised here)."""
    images, candidates = _unit(images), _unit(candidates)
    return w * np.clip(np.sum(images * candidates, axis=1), 0, None)


def ref_similarity(candidates: np.ndarray, references: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Per candidate i: the largest cosine between it and the reference rows whose ``owner`` is i."""
    candidates, references = _unit(candidates), _unit(references)
    best = np.full(len(candidates), -np.inf)
    np.maximum.at(best, owner, np.sum(candidates[owner] * references, axis=1))
    return best


def refclipscore(clip_s: np.ndarray, ref_s: np.ndarray) -> np.ndarray:
    """The harmonic mean of CLIPScore and the reference similarity (0 where both are 0)."""
    total = clip_s + ref_s
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total == 0, 0.0, 2 * clip_s * ref_s / np.where(total == 0, 1.0, total))


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.sum(x ** 2, axis=1, keepdims=True))
