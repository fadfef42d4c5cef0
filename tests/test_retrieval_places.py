"""Places settled within the tied block (tasks/score/retrieval_places.py) against a brute-force reference on
clip_benchmark's dense matrix: ties of every size (a tied block larger than the pass keeps), k beyond the candidates,
one query, many captions per image; exact entries in small blocks equal the full product bit for bit; and the tie
blocks do not send queries to their full rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_evidence_retrieval import clip_benchmark_hits
from test_retrieval_pass import tied_data, unit

from clipcache.tasks.score import retrieval_pass, retrieval_places, retrieval_queries
from clipcache.tasks.score.retrieval_pass import ExactScores, query_outcomes
from clipcache.tasks.score.retrieval_places import exact_entries, scored_at_least


def brute_force_places(scores: np.ndarray, positives: list[list[int]]):
    """Per row: best positive (highest score, lowest index), 1 + its stable rank, its score, the 3 best columns
    (equal scores by lower index), by plain Python loops over every row."""
    best, rank, score, top = [], [], [], []
    for row, own in zip(scores, positives, strict=True):
        ordered = np.lexsort((np.arange(len(row)), -row))  # descending score, then ascending index
        top.append(ordered[:3])
        if not own:
            best.append(-1), rank.append(0), score.append(np.nan)
            continue
        place = int(np.flatnonzero(np.isin(ordered, own))[0])
        best.append(ordered[place]), rank.append(place + 1), score.append(float(row[ordered[place]]))
    return np.array(best), np.array(rank), np.array(score), np.array(top)


def check(images, captions, caption_image, ks, budget=1 << 26):
    t2i, i2t = query_outcomes(torch.from_numpy(captions), torch.from_numpy(images), torch.from_numpy(caption_image),
                              ks, budget)
    full = (torch.from_numpy(captions) @ torch.from_numpy(images).T).numpy()
    for outcome, scores, positives in (
            (t2i, full, [[int(o)] for o in caption_image]),
            (i2t, full.T, [np.flatnonzero(caption_image == i).tolist() for i in range(len(images))])):
        best, rank, score, top = brute_force_places(scores, positives)
        assert (outcome.positive == best).all() and (outcome.rank == rank).all()
        # clip_benchmark's own scores where the window decided; the pass's kernel's elsewhere (within 1e-6)
        assert np.allclose(outcome.score, score, rtol=0, atol=1e-6, equal_nan=True)
        assert (outcome.top == top[:, : outcome.top.shape[1]]).all()
    for j, k in enumerate(ks):
        if k > min(full.shape):  # clip_benchmark raises; every query with a positive is a hit
            assert k <= len(images) or t2i.hits[:, j].all()
            assert k <= len(captions) or (i2t.hits[:, j] == np.isin(np.arange(len(images)), caption_image)).all()
            continue
        ref_t2i, ref_i2t = clip_benchmark_hits(images, captions, caption_image, k)
        assert (t2i.hits[:, j] == ref_t2i).all() and (i2t.hits[:, j] == ref_i2t).all(), k
    return t2i, i2t


@pytest.fixture(params=[True, False], ids=["small-matrix", "blocks"])
def entries_from(request, monkeypatch):
    """Exact scores read from the one full product (small problems) or computed in small blocks (large ones)."""
    if not request.param:
        monkeypatch.setattr(retrieval_pass, "SMALL_MATRIX", 0)
    return request.param


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("budget", [4 * 16 * 16, 1 << 26])
def test_tied_data_places_equal_brute_force(seed, budget, entries_from):
    images, captions, caption_image = tied_data(seed, n_images=90)
    t2i, i2t = check(images, captions, caption_image, [1, 5, 10], budget)
    assert t2i.tied.any() and i2t.tied.any()


def test_a_tied_block_larger_than_the_kept_list_and_k_beyond_the_candidates(entries_from):
    """40 copies of one caption text over 40 images tie at the top of image 0's column (more than the pass keeps):
    that query's top is ordered on the exact scores of the block (its window holds it), not on its row; the
    images' ranks among the copies come from the window."""
    rng = np.random.default_rng(11)
    images = unit(rng.normal(size=(48, 12)))
    text = unit(images[:1] + 0.05)
    others = unit(images[np.arange(48) % 48] + rng.normal(scale=0.3, size=(48, 12)))
    captions = np.concatenate([np.repeat(text, 40, axis=0), others])
    caption_image = np.concatenate([np.arange(40), np.arange(48)])
    t2i, i2t = check(images, captions, caption_image, [1, 5, 100])
    assert i2t.hits[:, 2].all()  # k=100 > 88 captions: every image with a caption hits
    args = (torch.from_numpy(captions), torch.from_numpy(images), torch.from_numpy(caption_image), [1, 5, 100])
    bare_t2i, bare_i2t = query_outcomes(*args, 1 << 26, places=False)
    assert (t2i.decided_exactly, i2t.decided_exactly) == (bare_t2i.decided_exactly, bare_i2t.decided_exactly)


def test_one_query_and_many_captions_of_one_text(entries_from):
    rng = np.random.default_rng(2)
    images = unit(rng.normal(size=(20, 8)))
    check(images, unit(rng.normal(size=(1, 8))), np.array([7]), [1, 3, 50])
    many = np.repeat(unit(images[:1] + 0.1), 30, axis=0)  # 30 equal captions of image 3 and others
    check(images, many, rng.integers(0, 20, size=30), [1, 5])


def captions_with_repeats(seed: int, n_images: int = 300, per_image: int = 5, dim: int = 32):
    """Captions near their image; a third of them copies of 20 frequent texts (each ~30 times, over other images),
    and 5% of the images exact duplicates: ties in both directions, as in COCO / Flickr."""
    rng = np.random.default_rng(seed)
    images = unit(rng.normal(size=(n_images, dim)))
    copies = rng.random(n_images) < 0.05
    images[copies] = images[rng.integers(0, n_images, copies.sum())]
    caption_image = np.repeat(np.arange(n_images), per_image)
    captions = unit(images[caption_image] + rng.normal(scale=0.25, size=(len(caption_image), dim)))
    repeated = rng.random(len(captions)) < 1 / 3
    captions[repeated] = captions[rng.choice(len(captions), 20, replace=False)][rng.integers(0, 20, repeated.sum())]
    return images, captions, caption_image


@pytest.mark.parametrize(("seed", "width", "budget"), [(0, None, 1 << 26), (1, None, 1 << 26), (2, 37, 4 * 37 * 90)])
def test_repeated_captions_places_equal_brute_force_and_stay_off_the_rows(seed, width, budget, monkeypatch):
    """The places come from the windows: the rows recomputed with places are those the recall decision recomputes
    anyway (topk's choice); an image whose top block of another image's copies runs past the kept list is ordered
    on the block's exact scores, not its row. With narrow tiles, a window spans several tiles and chunks."""
    monkeypatch.setattr(retrieval_pass, "SMALL_MATRIX", 0)
    if width:
        monkeypatch.setattr(retrieval_pass, "TILE_WIDTH", width)
    blocks = []

    def spy(exact, queries, bound, *, images):
        blocks.append(len(queries))
        return scored_at_least(exact, queries, bound, images=images)

    monkeypatch.setattr(retrieval_places, "scored_at_least", spy)
    images, captions, caption_image = captions_with_repeats(seed)
    t2i, i2t = check(images, captions, caption_image, [1, 5, 10], budget)
    assert sum(blocks) > 0  # some top blocks ran past the kept list and past the windows
    args = (torch.from_numpy(captions), torch.from_numpy(images), torch.from_numpy(caption_image), [1, 5, 10], budget)
    bare_t2i, bare_i2t = query_outcomes(*args, places=False)
    assert (t2i.hits == bare_t2i.hits).all() and (i2t.hits == bare_i2t.hits).all()
    assert t2i.tied.any() and i2t.tied.any()
    assert (t2i.decided_exactly, i2t.decided_exactly) == (bare_t2i.decided_exactly, bare_i2t.decided_exactly)


@pytest.mark.parametrize("dim", [8, 64, 512])
def test_exact_entries_in_small_blocks_equal_the_full_product(dim, monkeypatch):
    monkeypatch.setattr(retrieval_pass, "SMALL_MATRIX", 0)
    rng = np.random.default_rng(dim)
    captions, images = unit(rng.normal(size=(700, dim))), unit(rng.normal(size=(300, dim)))
    exact = ExactScores(torch.from_numpy(captions), torch.from_numpy(images), 1 << 26)
    assert exact.full is None
    caption, image = rng.integers(0, 700, size=2000), rng.integers(0, 300, size=2000)
    caption[:5], image[:5] = 3, np.arange(5)  # one caption with few images: padded blocks
    full = (torch.from_numpy(captions) @ torch.from_numpy(images).T).numpy()
    assert np.array_equal(exact_entries(exact, caption, image), full[caption, image])
    assert exact_entries(exact, caption[:0], image[:0]).shape == (0,)


def test_the_torch_count_path_gives_the_same_places(monkeypatch):
    """The counts and windows a GPU makes (torch operations on the tile), run here on CPU tensors: the same places
    as the NumPy path and the brute force."""
    init = retrieval_queries.PositionCounter.__init__

    def torch_path(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._cpu = False

    monkeypatch.setattr(retrieval_queries.PositionCounter, "__init__", torch_path)
    monkeypatch.setattr(retrieval_pass, "SMALL_MATRIX", 0)
    monkeypatch.setattr(retrieval_pass, "TILE_WIDTH", 37)
    images, captions, caption_image = captions_with_repeats(3, n_images=150)
    check(images, captions, caption_image, [1, 5, 10], 4 * 37 * 90)


@pytest.mark.parametrize("deep_columns", [0.0, 1.0])
def test_queries_counted_from_the_tiles_tops_or_on_the_tile_give_the_same_places(deep_columns, monkeypatch):
    """On the CPU a query whose window lies within the tile's top values (the pass keeps them anyway) is counted from
    them; the others on the tile: their rows, and their columns picked out, or every column once more than
    DEEP_COLUMNS of them are deep. Each way equals the brute force and counting every query on the tile."""
    monkeypatch.setattr(retrieval_queries, "DEEP_COLUMNS", deep_columns)
    monkeypatch.setattr(retrieval_pass, "TILE_WIDTH", 37)
    seen = {"rows": [], "columns": []}
    counter = retrieval_queries.PositionCounter
    rows_from_top, columns_from_top = counter._rows_from_top, counter._columns_from_top

    def spy_rows(self, span, values, where):
        seen["rows"].append(deep := rows_from_top(self, span, values, where))
        return deep

    def spy_columns(self, span, values, where):
        seen["columns"].append(deep := columns_from_top(self, span, values, where))
        return deep

    monkeypatch.setattr(counter, "_rows_from_top", spy_rows)
    monkeypatch.setattr(counter, "_columns_from_top", spy_columns)
    images, captions, caption_image = captions_with_repeats(4, n_images=150)
    t2i, i2t = check(images, captions, caption_image, [1, 5, 10], 4 * 37 * 90)
    deep_rows = np.concatenate(seen["rows"])
    assert deep_rows.any() and not deep_rows.all()  # both ways taken
    picked = [deep for deep in seen["columns"] if deep is not None]
    if deep_columns == 0.0:  # every tile with a deep column compares all its columns
        assert len(picked) < len(seen["columns"]) and not any(len(deep) for deep in picked)
    else:
        assert len(picked) == len(seen["columns"]) and any(len(deep) for deep in picked)
    add = counter.add
    monkeypatch.setattr(counter, "add", lambda self, *args, tops: add(self, *args, tops=None))  # all on the tile
    args = (torch.from_numpy(captions), torch.from_numpy(images), torch.from_numpy(caption_image), [1, 5, 10])
    every_t2i, every_i2t = query_outcomes(*args, 4 * 37 * 90)
    for ours, every in ((t2i, every_t2i), (i2t, every_i2t)):
        for name in ("hits", "tied", "positive", "rank", "top"):
            assert np.array_equal(getattr(ours, name), getattr(every, name)), name
        assert np.array_equal(ours.score, every.score, equal_nan=True)


@pytest.mark.parametrize("images_asked", [5, 300])
def test_exact_entries_grouped_by_image_or_by_caption_equal_the_full_product(images_asked, monkeypatch):
    """Pairs that ask few images (a block of tied captions per image) are computed a block of images at a time,
    the others a block of captions at a time: both are entries of ``captions @ images.T``, bit for bit; so is a
    single pair (padded blocks)."""
    monkeypatch.setattr(retrieval_pass, "SMALL_MATRIX", 0)
    rng = np.random.default_rng(images_asked)
    captions, images = unit(rng.normal(size=(700, 64))), unit(rng.normal(size=(300, 64)))
    captions[::7] = captions[0]  # exact copies of one text
    exact = ExactScores(torch.from_numpy(captions), torch.from_numpy(images), 1 << 26)
    full = (torch.from_numpy(captions) @ torch.from_numpy(images).T).numpy()
    caption, image = rng.integers(0, 700, size=3000), rng.integers(0, images_asked, size=3000)
    assert np.array_equal(exact_entries(exact, caption, image), full[caption, image])
    assert np.array_equal(exact_entries(exact, caption[:1], image[:1]), full[caption[:1], image[:1]])


@pytest.mark.parametrize("images", [False, True])
def test_scored_at_least_finds_every_candidate_at_or_above_the_bound(images):
    """Brute force: every (query, candidate) whose score reaches the query's bound, none other, in blocks of queries
    (a small budget) and for no query at all."""
    rng = np.random.default_rng(3)
    captions, pictures = unit(rng.normal(size=(90, 16))), unit(rng.normal(size=(40, 16)))
    exact = ExactScores(torch.from_numpy(captions), torch.from_numpy(pictures), 4 * 90 * 17)
    scores = pictures @ captions.T if images else captions @ pictures.T
    queries = rng.choice(len(scores), size=25, replace=False)
    ordered = np.sort(scores[queries], axis=1)
    bound = ((ordered[:, -7] + ordered[:, -8]) / 2).astype(np.float32)  # 7 candidates each, none near the bound
    query, candidate = scored_at_least(exact, queries, bound, images=images)
    expected = {(int(q), int(c)) for q, b in zip(queries, bound, strict=True) for c in np.flatnonzero(scores[q] >= b)}
    assert set(zip(query.tolist(), candidate.tolist(), strict=True)) == expected and len(query) == 25 * 7
    assert [len(a) for a in scored_at_least(exact, queries[:0], bound[:0], images=images)] == [0, 0]
