"""Beam search for open_clip's CoCa, as ``CoCa.generate(generation_type="beam_search")`` does it with transformers 4's
``BeamSearchScorer``, without transformers (version 5 removed the scorer, and open_clip 3.3.0 cannot run its beam
search without it).

open_clip's decoding (``coca_model.py: _generate_beamsearch``, its defaults): ``num_beams`` 6 in ``num_beam_groups``
3 groups of 2 (group beam search without a diversity penalty: each group is a beam search of its own over the same
image, and at the start only the first beam of each group is live, the others scored -1e9); a step's scores are the
decoder's raw logits of the last position (no log-softmax), with ``<end_of_text>`` forbidden while the sequence,
``<start_of_text>`` included, is shorter than ``min_seq_len``, added to the beam's score. Per group the 2 x 2 best
(beam, token) continuations are taken in order: an ``<end_of_text>`` among the first 2 ends a hypothesis (the
sequence without it, scored by its sum over its length: length penalty 1), others continue until the group has 2
beams. A group is done once it holds 2 hypotheses and the best continuation's score over the current length cannot
beat the worse one; the search stops when every group is done or the sequences reach ``seq_len`` tokens. Then each
live beam is offered as a hypothesis too, and the best hypothesis over all groups (the last of equal ones, in group
order) is the caption, ``<end_of_text>`` appended where it is shorter than the longest, padded with the model's pad
id, at most ``seq_len`` tokens.

tests/test_captioning_beam.py compares this with open_clip's own beam search under transformers 4 token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SOT, EOT = 49406, 49407  # open_clip's tokenizer: <start_of_text>, <end_of_text>
BEAM_DEFAULTS = {"num_beams": 6, "num_beam_groups": 3, "min_seq_len": 5}  # open_clip generate()'s


@dataclass
class _Hypotheses:
    """The ``size`` best finished sequences of one group of one image (score: sum of step scores / length)."""

    size: int
    beams: list[tuple[float, Any]] = field(default_factory=list)
    worst: float = 1e9

    def add(self, tokens: Any, total: float, length: int) -> None:
        score = total / length
        if len(self.beams) < self.size or score > self.worst:
            self.beams.append((score, tokens))
            if len(self.beams) > self.size:
                ranked = sorted((s, i) for i, (s, _) in enumerate(self.beams))
                del self.beams[ranked[0][1]]
                self.worst = ranked[1][0]
            else:
                self.worst = min(score, self.worst)

    def done(self, best_total: float, length: int) -> bool:
        return len(self.beams) >= self.size and self.worst >= best_total / length


def beam_search(module: Any, images: Any, *, seq_len: int, num_beams: int = 6, num_beam_groups: int = 3,
                min_seq_len: int = 5) -> Any:
    """Token ids (batch, <= seq_len), ``<start_of_text>`` first, of open_clip's beam search on ``images``."""
    import torch

    if num_beams < 2 or num_beams % num_beam_groups:
        raise ValueError(f"num_beams {num_beams} must be 2 or more and a multiple of num_beam_groups "
                         f"{num_beam_groups}")
    batch, group = images.shape[0], num_beams // num_beam_groups
    pad = module.pad_id
    images = torch.repeat_interleave(images, num_beams, dim=0)
    latent, embs = module._encode_image(images)
    ids = torch.full((batch * num_beams, 1), SOT, dtype=torch.long, device=images.device)
    scores = torch.full((batch, num_beams), -1e9, dtype=torch.float, device=images.device)
    scores[:, ::group] = 0
    scores = scores.view(-1)
    hypotheses = [[_Hypotheses(group) for _ in range(num_beam_groups)] for _ in range(batch)]
    done = [[False] * num_beam_groups for _ in range(batch)]
    while True:
        current = torch.zeros(batch * num_beams, dtype=torch.long, device=images.device)
        logits = module(images, ids, image_latent=latent, image_embs=embs, output_labels=False)["logits"]
        for g in range(num_beam_groups):
            rows = [b * num_beams + g * group + j for b in range(batch) for j in range(group)]
            group_ids = ids[rows]
            step = logits[rows, -1, :]
            if group_ids.shape[-1] < min_seq_len:
                step = step.clone()
                step[:, EOT] = -float("inf")
            vocab = step.shape[-1]
            totals = (step + scores[rows].unsqueeze(-1)).view(batch, group * vocab)
            top, flat = torch.topk(totals, 2 * group, dim=1, largest=True, sorted=True)
            origin, tokens = torch.div(flat, vocab, rounding_mode="floor"), flat % vocab
            kept_scores, kept_tokens, kept_rows = _advance(hypotheses, done, g, group_ids, top=top, tokens=tokens,
                                                           origin=origin, pad=pad)
            scores[rows] = kept_scores
            ids[rows] = group_ids[kept_rows]
            current[rows] = kept_tokens
        ids = torch.cat([ids, current.unsqueeze(-1)], dim=-1)
        if all(all(d) for d in done) or ids.shape[-1] >= seq_len:
            break
    return _finish(hypotheses, done, ids, scores, seq_len=seq_len, pad=pad)


def _advance(hypotheses: list[list[_Hypotheses]], done: list[list[bool]], g: int, group_ids: Any, *, top: Any,
             tokens: Any, origin: Any, pad: int) -> tuple[Any, Any, Any]:
    """One step of group ``g`` for every image: the continuations kept (scores, tokens, source rows within the
    group's rows), the hypotheses ended by ``<end_of_text>``, and whether the group is done."""
    import torch

    batch, width = top.shape
    group = width // 2
    length = group_ids.shape[-1] + 1
    kept_scores = torch.zeros((batch, group), dtype=top.dtype, device=top.device)
    kept_tokens = torch.zeros((batch, group), dtype=tokens.dtype, device=top.device)
    kept_rows = torch.zeros((batch, group), dtype=origin.dtype, device=top.device)
    for b in range(batch):
        if done[b][g]:  # a finished group idles: pad tokens (its rows copy the group's first row, as open_clip's)
            kept_tokens[b, :] = pad
            continue
        n = 0
        for rank in range(width):
            token, row = int(tokens[b, rank]), b * group + int(origin[b, rank])
            if token == EOT:
                if rank < group:
                    hypotheses[b][g].add(group_ids[row].clone(), top[b, rank].item(), length)
            else:
                kept_scores[b, n], kept_tokens[b, n], kept_rows[b, n] = top[b, rank], token, row
                n += 1
            if n == group:
                break
        if n < group:
            raise ValueError(f"beam search: more than {group} of the best continuations end the caption")
        done[b][g] = done[b][g] or hypotheses[b][g].done(top[b].max().item(), length)
    return kept_scores.view(-1), kept_tokens.view(-1), kept_rows.view(-1)


def _finish(hypotheses: list[list[_Hypotheses]], done: list[list[bool]], ids: Any, scores: Any, *, seq_len: int,
            pad: int) -> Any:
    import torch

    num_groups = len(hypotheses[0])
    group = hypotheses[0][0].size
    best = []
    for b, groups in enumerate(hypotheses):
        for g, found in enumerate(groups):
            if not done[b][g]:
                for j in range(group):
                    row = (b * num_groups + g) * group + j
                    found.add(ids[row], scores[row].item(), ids.shape[-1])
        candidates = [beam for found in groups for beam in found.beams]
        best.append(sorted(candidates, key=lambda c: c[0])[-1][1])
    width = min(max(len(t) for t in best) + 1, seq_len)
    out = torch.full((len(best), width), pad, dtype=ids.dtype, device=ids.device)
    for i, tokens in enumerate(best):
        out[i, :len(tokens)] = tokens
        if len(tokens) < width:
            out[i, len(tokens)] = EOT
    return out
