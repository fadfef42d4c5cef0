"""Flickr30K-CN and COCO-CN (``--language cn``) read from the layout of InternVL's clip_benchmark fork: the seed's four
Chinese retrieval commands run as typed there (paths of this machine, the opt-in added) on a tiny local copy of that
layout, and their numbers equal LAION clip_benchmark's retrieval metric over the fork's readers (clip_benchmark's
``Flickr`` on ``Images/``, torchvision's ``CocoCaptions`` on the root) with the fork's caption clean-up, and the
model wired as the fork wires it."""

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
from clipcache.tasks.datasets import open_dataset
from clipcache.tasks.datasets.clip_benchmark.internvl_cn import fork_caption

from hostile import assert_refused, run_cli

FOLDER = "./pretrained/InternVL-14B-224px"
# The seed's Chinese retrieval commands as typed there (clip_benchmark/cli.py -> clipcache), the Hugging Face folder
# as --pretrained, the opt-in added.
SEED = {
    "flickr_c": 'eval --model_type internvl --language "cn" --task "zeroshot_retrieval" --dataset "flickr30k" '
                '--dataset_root ./data/flickr30k --model internvl_c_retrieval --pretrained {folder} '
                '--output result.json',
    "coco_c": 'eval --model_type internvl --language "cn" --task "zeroshot_retrieval" --dataset "mscoco_captions" '
              '--dataset_root ./data/mscoco_captions --model internvl_c_retrieval --pretrained {folder} '
              '--output result.json',
    "flickr_g": 'eval --model_type internvl --language "cn" --task "zeroshot_retrieval" --dataset "flickr30k" '
                '--dataset_root ./data/flickr30k --model internvl_g_retrieval_hf --pretrained {folder} '
                '--output result_g.json',
    "coco_g": 'eval --model_type internvl --language "cn" --task "zeroshot_retrieval" --dataset "mscoco_captions" '
              '--dataset_root ./data/mscoco_captions --model internvl_g_retrieval_hf --pretrained {folder} '
              '--output result_g.json',
}
PHRASES = ["一只狗在草地上奔跑。", "两个人（男人和女人）在 Park: 散步!!", "红色的车停在路边", "A Man;  骑着 自行车~",
           "孩子们在海滩上玩耍。", "一只猫 (睡觉) 在沙发上", "厨房里有很多碗*盘子", "#雪山# 和蓝天"]


def _image(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(seed)
    Image.fromarray((rng.rand(28 + seed % 9, 40, 3) * 255).astype("uint8")).save(path)


def _captions(i: int) -> list[str]:
    return [f"{PHRASES[(i + j) % len(PHRASES)]} {i}" for j in range(1 + i % 3)]


def write_flickr30k_cn(root: Path, n: int = 12) -> Path:
    """The fork's Flickr30K-CN: Images/<id>.jpg and flickr30k_cn_test.txt (a header, then <image>.jpg,<caption>)."""
    lines = ["image,caption"]
    for i in range(n):
        _image(root / "Images" / f"{2000 + i}.jpg", i)
        lines += [f"{2000 + i}.jpg,{c}" for c in _captions(i)]
    (root / "flickr30k_cn_test.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def write_coco_cn(root: Path, n: int = 11) -> Path:
    """The fork's COCO-CN: coco-cn_test.json in COCO's format naming train2014/ and val2014/ images under the root,
    listed out of id order (read by ascending id)."""
    images, annotations = [], []
    for i in range(n):
        image_id = (i * 7919) % 1000 + 1
        folder = "train2014" if i % 2 else "val2014"
        file_name = f"{folder}/COCO_{folder}_{image_id:012d}.jpg"
        _image(root / file_name, 100 + i)
        images.append({"id": image_id, "file_name": file_name})
        annotations += [{"id": len(annotations) + j, "image_id": image_id, "caption": c}
                        for j, c in enumerate(_captions(i))]
    (root / "coco-cn_test.json").write_text(json.dumps({"images": images, "annotations": annotations}),
                                            encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("internvl_cn")
    make_internvl_folder(root / "pretrained" / "InternVL-14B-224px")
    write_flickr30k_cn(root / "data" / "flickr30k")
    write_coco_cn(root / "data" / "mscoco_captions")
    return root


@pytest.fixture
def here(work, monkeypatch):
    monkeypatch.chdir(work)
    return work


def test_the_forks_caption_clean_up_by_hand():
    assert fork_caption("两个人（男人和女人）在 Park: 散步!!") == "两个人（男人和女人）在 park 散步"
    assert fork_caption("A Man;  骑着 自行车~\n") == "a man 骑着 自行车"
    assert fork_caption("#雪山# 和蓝天。") == "雪山 和蓝天。"  # full-width marks stay
    assert fork_caption("一只猫\t睡觉") == "一只猫\t睡觉"  # one whitespace character is left as it is
    assert fork_caption(" ".join(["词"] * 60)) == " ".join(["词"] * 50)
    assert fork_caption("没有空格的中文句子" * 20) == "没有空格的中文句子" * 20


def test_the_forks_layouts_are_read_with_cleaned_captions(work):
    flickr = open_dataset("flickr30k", str(work / "data" / "flickr30k"), "test", None, language="cn")
    assert [p.name for p in flickr.paths] == [f"{2000 + i}.jpg" for i in range(12)]
    assert flickr.captions is not None and flickr.captions[1] == [fork_caption(c) for c in _captions(1)]
    assert flickr.captions[1][0] == "两个人（男人和女人）在 park 散步 1" and flickr.languages == ("cn",)
    coco = open_dataset("mscoco_captions", str(work / "data" / "mscoco_captions"), "test", 4, language="cn")
    ids = [int(p.stem.rsplit("_", 1)[1]) for p in coco.paths]
    assert ids == sorted(ids) and len(ids) == 4 and {p.parent.name for p in coco.paths} <= {"train2014", "val2014"}


def test_missing_files_are_named_in_one_line(tmp_path, here, capsys):
    root = write_flickr30k_cn(tmp_path / "flickr30k", n=2)
    (root / "Images" / "2001.jpg").unlink()
    with pytest.raises(DatasetError, match=r"image .*2001.jpg \(named in flickr30k_cn_test.txt\) not found"):
        open_dataset("flickr30k", str(root), "test", None, language="cn")
    coco = write_coco_cn(tmp_path / "coco", n=2)
    (coco / "coco-cn_test.json").rename(coco / "coco-cn_val.json")
    with pytest.raises(DatasetError, match=r"coco-cn_test.json not found \(the Chinese captions InternVL's"):
        open_dataset("mscoco_captions", str(coco), "test", None, language="cn")
    code, _, err = run_cli(["eval", "--model_type", "internvl", "--model", "internvl_c_retrieval", "--pretrained",
                            FOLDER, "--trust_remote_code", "--dataset", "flickr30k", "--dataset_root", str(root),
                            "--language", "cn", "--quiet", "--orchestrator", "local"], capsys)
    assert_refused(code, err, "2001.jpg")


def _fork_metrics(key: str, recall_k: list[int]) -> dict[str, float]:
    """LAION clip_benchmark's retrieval metric over the fork's readers and caption clean-up, the model wired as the
    fork wires it (encode_image in the head's mode, summarize: and 80 tokens, the square resize)."""
    from clip_benchmark.datasets.builder import get_dataset_collate_fn
    from clip_benchmark.datasets.flickr import Flickr
    from clip_benchmark.metrics import zeroshot_retrieval
    from torchvision.datasets import CocoCaptions

    model, tokenize, transform = fork_retrieval_wiring(FOLDER, "InternVL-G" if key.endswith("_g") else "InternVL-C")

    def clean(captions):
        return [fork_caption(c) for c in captions]

    if key.startswith("flickr"):
        root = "./data/flickr30k"
        ds = Flickr(f"{root}/Images", f"{root}/flickr30k_cn_test.txt", transform=transform, target_transform=clean)
    else:
        root = "./data/mscoco_captions"
        ds = CocoCaptions(root, f"{root}/coco-cn_test.json", transform=transform, target_transform=clean)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=False, num_workers=0,
                                         collate_fn=get_dataset_collate_fn("mscoco_captions"))
    return zeroshot_retrieval.evaluate(model, loader, tokenize, "cpu", amp=False, recall_k_list=recall_k)


@pytest.mark.parametrize("key", list(SEED))
def test_the_seeds_cn_commands_equal_clip_benchmark_over_the_forks_readers(here, capsys, key):
    words = shlex.split(SEED[key])
    output = here / words[words.index("--output") + 1]
    output.unlink(missing_ok=True)
    code, _, err = run_cli([*shlex.split(SEED[key].format(folder=FOLDER)), "--trust_remote_code",
                            "--quiet", "--orchestrator", "local"], capsys)
    assert code == 0, err
    result = json.loads(output.read_text())
    assert result["language"] == "cn" and result["model"] == words[words.index("--model") + 1]
    ours = result["metrics"]
    theirs = _fork_metrics(key, [1, 5, 10])  # the seed's default recall@1/5/10
    assert len(theirs) == 6
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(value, abs=1e-9), name
