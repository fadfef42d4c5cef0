"""Multiple-choice accuracy as MIEB scores its Any2AnyMultipleChoice / vision-centric QA tasks (mteb 2.x's CV-Bench
tasks: ``AbsTaskRetrieval`` with ``top_ranked`` choices, main score ``accuracy``).

mteb turns each question into a query of an image and a text, and its choices into documents of a corpus that holds
each distinct choice text once (ids ``corpus-<split>-<k>``, k counting distinct texts in first-seen order); each
query is reranked against its own choices only. So, per question:

- the query vector is the sum of its image's and its question's embeddings (``text_embeddings + image_embeddings``,
  what mteb's CLIP-style wrappers return for an image+text input), here the raw features (each cached row
  times its stored norm; an entry written before norms were kept sums normalised rows, with a warning);
- each distinct choice scores the cosine similarity ``normalize(query) @ normalize(choice)`` (mteb's ``cos_sim``,
  torch float32, one question at a time as mteb's reranking loop computes it);
- choices are ranked as pytrec_eval ranks them: score descending, equal scores by document id descending, so of
  tied choices the one whose k is largest *as text* wins (``"9"`` above ``"10"``);
- the question is right when the top choice's text is the answer's (``recall@1`` of its one relevant document).

``acc1`` is the fraction of questions answered right, mteb's ``accuracy`` (which it rounds to 5 decimals).
"""

from __future__ import annotations

import numpy as np
import torch

from clipcache.tasks.score.evidence import Evidence
from clipcache.tasks.score.intervals import DEFAULT_RESAMPLES, interval, mean_statistic


def choice_outcomes(image: np.ndarray, question: np.ndarray, choices: np.ndarray,
                    question_choices: list[np.ndarray], answers: np.ndarray) -> dict[str, np.ndarray]:
    """Per question (rows of ``image`` and ``question``, its choices' rows of ``choices`` in ``question_choices``,
    its answer's index among them in ``answers``): ``prediction`` (the index of the first choice with the top
    text), ``correct1``, ``rank`` (1 + the distinct choices ranked above the answer's text), ``tied`` (the top score
    is shared: the document-id rule decided), ``score`` (the top similarity) and ``margin`` (the answer's similarity
    minus its best rival's; NaN when every choice has the answer's text)."""
    n = len(answers)
    out: dict[str, np.ndarray] = {"prediction": np.zeros(n, np.int64), "correct1": np.zeros(n, bool),
                                  "rank": np.zeros(n, np.int64), "tied": np.zeros(n, bool),
                                  "score": np.zeros(n), "margin": np.full(n, np.nan)}
    queries = torch.from_numpy(np.ascontiguousarray(image + question))  # float32, as mteb's fused embeddings
    documents = torch.from_numpy(np.ascontiguousarray(choices))
    for i in range(n):
        rows = question_choices[i]
        candidates = np.asarray(list(dict.fromkeys(rows.tolist())), np.int64)  # distinct, first-seen order
        scores = torch.nn.functional.normalize(queries[i:i + 1], p=2, dim=1) @ \
            torch.nn.functional.normalize(documents[candidates], p=2, dim=1).T
        values = scores[0].tolist()
        # pytrec_eval's order: score descending, then document id ("corpus-<split>-<k>") descending
        ranked = sorted(range(len(candidates)), key=lambda j: (values[j], str(candidates[j])), reverse=True)
        best, right = candidates[ranked[0]], rows[answers[i]]
        out["prediction"][i] = int(np.flatnonzero(rows == best)[0])
        out["correct1"][i] = best == right
        out["rank"][i] = 1 + [candidates[j] for j in ranked].index(right)
        out["tied"][i] = sum(v == values[ranked[0]] for v in values) > 1
        out["score"][i] = values[ranked[0]]
        rivals = [values[j] for j in range(len(candidates)) if candidates[j] != right]
        if rivals:
            out["margin"][i] = values[int(np.flatnonzero(candidates == right)[0])] - max(rivals)
    return out


def choice_evidence(outcomes: dict[str, np.ndarray], answers: np.ndarray, sample_index: np.ndarray, *,
                    resamples: int = DEFAULT_RESAMPLES, seed: int = 0, keys: list[str] | None = None) -> Evidence:
    """One row per question (unit ``example``): its answer in ``target``, the chosen choice in ``prediction``,
    ``correct1`` (acc1 is their mean), ``rank``, ``tied``, ``score`` and ``margin``; acc1's interval resamples the
    questions."""
    columns = {"sample_index": np.asarray(sample_index, np.int64), "target": np.asarray(answers, np.int64),
               **outcomes}
    intervals = {}
    if resamples > 0 and len(answers):
        intervals["acc1"] = interval(mean_statistic(outcomes["correct1"]), len(answers), resamples=resamples,
                                     seed=seed)
    return Evidence("example", columns, keys, intervals)
