"""English Flickr30K in the layout InternVL's clip_benchmark fork reads (images under ``Images/``, captions through the
fork's ``pre_caption``): the seed's two English Flickr30K commands run as typed there (paths of this machine, the
opt-in added) on a tiny copy of that layout and equal LAION clip_benchmark's retrieval metric over clip_benchmark's
``Flickr`` reader on ``Images/`` with the fork's clean-up, the model wired as the fork wires it. The same files in
LAION's layout (images beside the caption file) read as before: raw captions, no new option, their own entries."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from internvl_fixtures import fork_retrieval_wiring, make_internvl_folder
from PIL import Image

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import open_dataset
from clipcache.tasks.datasets.clip_benchmark.internvl_cn import fork_caption

from hostile import assert_refused, run_cli

FOLDER = "./pretrained/InternVL-14B-224px"
# The seed's English Flickr30K commands (InternVL's clip_benchmark README) as typed there, the Hugging Face folder
# as --pretrained and the opt-in added.
SEED = {
    "c": 'eval --model_type internvl --language "en" --task "zeroshot_retrieval" --dataset "flickr30k" '
         '--dataset_root ./data/flickr30k --model internvl_c_retrieval --pretrained {folder} --output result.json',
    "g": 'eval --model_type internvl --language "en" --task "zeroshot_retrieval" --dataset "flickr30k" '
         '--dataset_root ./data/flickr30k --model internvl_g_retrieval_hf --pretrained {folder} '
         '--output result_g.json',
}
PHRASES = ["A Dog runs across the GRASS.", "Two people (a man and a woman) walk: in the park!!", "A red car; parked",
           "Children play on the beach ~ at sunset", "A cat sleeps on the sofa *quietly*", "#Snowy# mountains"]


def _captions(i: int) -> list[str]:
    return [f"{PHRASES[(i + j) % len(PHRASES)]} {i}" for j in range(1 + i % 3)]


def write_flickr30k(root: Path, *, fork: bool, n: int = 10) -> Path:
    """flickr30k_test_karpathy.txt (a header, then <image>.jpg,<caption>) with the images under Images/ (the fork's
    layout) or beside it (LAION's)."""
    images = root / "Images" if fork else root
    images.mkdir(parents=True, exist_ok=True)
    lines = ["image,caption"]
    for i in range(n):
        rng = np.random.RandomState(i)
        Image.fromarray((rng.rand(30 + i % 7, 40, 3) * 255).astype("uint8")).save(images / f"{3000 + i}.jpg")
        lines += [f"{3000 + i}.jpg,{c}" for c in _captions(i)]
    (root / "flickr30k_test_karpathy.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("internvl_flickr_en")
    make_internvl_folder(root / "pretrained" / "InternVL-14B-224px")
    write_flickr30k(root / "data" / "flickr30k", fork=True)
    write_flickr30k(root / "data" / "laion", fork=False)
    return root


@pytest.fixture
def here(work, monkeypatch):
    monkeypatch.chdir(work)
    return work


def test_each_layout_is_read_by_its_own_reader(work):
    fork = open_dataset("flickr30k", str(work / "data" / "flickr30k"), "test", None)
    laion = open_dataset("flickr30k", str(work / "data" / "laion"), "test", None)
    assert [p.name for p in fork.paths] == [p.name for p in laion.paths] == [f"{3000 + i}.jpg" for i in range(10)]
    assert {p.parent.name for p in fork.paths} == {"Images"} and {p.parent.name for p in laion.paths} == {"laion"}
    assert laion.captions == [_captions(i) for i in range(10)]  # LAION's: as written
    assert fork.captions == [[fork_caption(c) for c in _captions(i)] for i in range(10)]
    assert fork.captions[1][0] == "two people a man and a woman walk in the park 1"
    assert getattr(fork, "experiment_reader", None) == "internvl_fork"
    assert getattr(laion, "experiment_reader", None) is None
    memo = FileHashMemo(None)
    ours, theirs = fork.identity(memo), laion.identity(memo)
    assert (ours["format"], theirs["format"]) == ("flickr-en-internvl", "flickr-en")
    assert ours["captions"] == theirs["captions"] and ours != theirs  # one caption file, two readings


def test_a_folder_with_both_layouts_is_refused_in_one_line(tmp_path, here, capsys):
    root = write_flickr30k(tmp_path / "both", fork=True, n=2)
    write_flickr30k(root, fork=False, n=2)
    with pytest.raises(DatasetError, match=r"3000.jpg is both in .* \(LAION clip_benchmark's layout\) and in "):
        open_dataset("flickr30k", str(root), "test", None)
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "flickr30k", "--dataset_root",
                            str(root), "--quiet", "--orchestrator", "local"], capsys)
    assert_refused(code, err, "keep one copy")
    (root / "Images" / "3001.jpg").unlink()  # the first image decides; a later one missing is named as such
    (root / "3000.jpg").unlink()
    with pytest.raises(DatasetError, match=r"image .*Images/3001.jpg \(named in flickr30k_test_karpathy.txt\) not "
                                           r"found \(InternVL's clip_benchmark fork"):
        open_dataset("flickr30k", str(root), "test", None)


def test_the_forks_reading_is_its_own_experiment(here, capsys):
    """The same model on both layouts: LAION's result is the reference experiment (no option, as before), the
    fork's carries reader=internvl_fork in its experiment and its file name."""
    experiments = {}
    for layout in ("laion", "flickr30k"):
        code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "flickr30k", "--dataset_root",
                                f"./data/{layout}", "--output_dir", "out", "--quiet", "--orchestrator", "local"],
                               capsys)
        assert code == 0, err
    for path in (here / "out").rglob("flickr30k_zeroshot_retrieval*.json"):
        experiments[path.name] = json.loads(path.read_text())["experiment"]
    assert set(experiments) == {"flickr30k_zeroshot_retrieval.json",
                                "flickr30k_zeroshot_retrieval.reader-internvl_fork.json"}
    laion, fork = experiments["flickr30k_zeroshot_retrieval.json"], \
        experiments["flickr30k_zeroshot_retrieval.reader-internvl_fork.json"]
    assert json.loads(laion["options"]) == {} and json.loads(fork["options"]) == {"reader": "internvl_fork"}
    assert laion["id"] != fork["id"]


@pytest.mark.parametrize("key", list(SEED))
def test_the_seeds_english_flickr_commands_equal_clip_benchmark_over_the_forks_reader(here, capsys, key):
    from clip_benchmark.datasets.builder import get_dataset_collate_fn
    from clip_benchmark.datasets.flickr import Flickr
    from clip_benchmark.metrics import zeroshot_retrieval

    words = shlex.split(SEED[key])
    output = here / words[words.index("--output") + 1]
    output.unlink(missing_ok=True)
    code, _, err = run_cli([*shlex.split(SEED[key].format(folder=FOLDER)), "--trust_remote_code", "--quiet",
                            "--orchestrator", "local"], capsys)
    assert code == 0, err
    result = json.loads(output.read_text())
    assert result["language"] == "en" and result["dataset"] == "flickr30k"
    model, tokenize, transform = fork_retrieval_wiring(FOLDER, "InternVL-G" if key == "g" else "InternVL-C")
    ds = Flickr("./data/flickr30k/Images", "./data/flickr30k/flickr30k_test_karpathy.txt", transform=transform,
                target_transform=lambda captions: [fork_caption(c) for c in captions])
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=False, num_workers=0,
                                         collate_fn=get_dataset_collate_fn("flickr30k"))
    theirs = zeroshot_retrieval.evaluate(model, loader, tokenize, "cpu", amp=False, recall_k_list=[1, 5, 10])
    assert len(theirs) == 6
    for name, value in theirs.items():
        assert result["metrics"][name] == pytest.approx(value, abs=1e-9), name
