"""Birdsnap (``--dataset birdsnap``) in the layout of InternVL's clip_benchmark fork (its BirdsnapV2:
test_images_valid.txt + species.txt beside the species folders), on a tiny folder written here: the samples, labels,
class names and templates by hand, the score equal to LAION clip_benchmark's ``zeroshot_classification.evaluate``
over the same images and labels, and the seed's Birdsnap command run as typed there (the Hugging Face folder for the
.pth, the opt-in added) equal to clip_benchmark's metric with the model wired as the fork wires it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from internvl_fixtures import fork_retrieval_wiring, make_internvl_folder
from PIL import Image

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import open_dataset
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, ScoreSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

from hostile import assert_refused, run_cli

# Birdsnap's species.txt columns; the folder column in lower case, the image list's folders capitalised as in
# Birdsnap's own tree (the fork lower-cases the image's folder to find its row).
SPECIES = [("1", "Acadian Flycatcher", "Empidonax virescens", "acadian_flycatcher"),
           ("2", "Acorn Woodpecker", "Melanerpes formicivorus", "acorn_woodpecker"),
           ("3", "Alder Flycatcher", "Empidonax alnorum", "alder_flycatcher"),
           ("4", "Allens Hummingbird", "Selasphorus sasin", "allens_hummingbird")]
# (listed image, its class index): listed out of class order
IMAGES = [("Acorn_Woodpecker/101.jpg", 1), ("Acadian_Flycatcher/7.jpg", 0), ("Allens_Hummingbird/3.jpg", 3),
          ("Acadian_Flycatcher/2.jpg", 0), ("Alder_Flycatcher/55.jpg", 2), ("Acorn_Woodpecker/4.jpg", 1),
          ("Allens_Hummingbird/9.jpg", 3), ("Alder_Flycatcher/1.jpg", 2), ("Acadian_Flycatcher/30.jpg", 0)]
SEED = ('eval --model_type internvl --language "en" --task "zeroshot_classification" --dataset "birdsnap" '
        '--dataset_root ./data/birdsnap/ --model internvl_c_classification --pretrained {folder} --output result.json')


def write_birdsnap(root: Path, newline: str = "\n") -> Path:
    for i, (image, _) in enumerate(IMAGES):
        (root / image).parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.RandomState(i)
        Image.fromarray((rng.rand(40 + i, 36, 3) * 255).astype("uint8")).save(root / image)
    species = ["id\tcommon\tscientific\tdir", *("\t".join(row) for row in SPECIES)]
    (root / "species.txt").write_bytes((newline.join(species) + newline).encode())
    listed = ["path", *(image for image, _ in IMAGES)]
    (root / "test_images_valid.txt").write_bytes((newline.join(listed) + newline).encode())
    return root


class Listed(torch.utils.data.Dataset):
    """The images and labels this file wrote, in list order: what clip_benchmark's evaluate is given."""

    def __init__(self, root: Path, transform):
        self.root, self.transform = root, transform
        self.classes = [row[1] for row in SPECIES]

    def __len__(self):
        return len(IMAGES)

    def __getitem__(self, i):
        image, label = IMAGES[i]
        return self.transform(Image.open(self.root / image).convert("RGB")), label


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_the_lists_are_read_as_the_fork_reads_them(tmp_path, newline):
    root = write_birdsnap(tmp_path / "birdsnap", newline)
    ds = open_dataset("birdsnap", str(root), "test", None)
    assert [p.relative_to(root).as_posix() for p in ds.paths] == [image for image, _ in IMAGES]
    assert ds.labels.tolist() == [label for _, label in IMAGES]
    assert ds.prompts.classnames == ["Acadian Flycatcher", "Acorn Woodpecker", "Alder Flycatcher",
                                     "Allens Hummingbird"]
    assert ds.prompts.templates == ["a photo of a {c}, a type of bird."] and ds.languages == ("en",)
    limited = open_dataset("birdsnap", str(root), "test", 4)
    assert limited.labels.tolist() == [1, 0, 3, 0] and len(limited.paths) == 4
    assert ds.identity(FileHashMemo(None))["format"] == "birdsnap-internvl"


def test_bad_folders_are_named_in_one_line(tmp_path, capsys):
    root = write_birdsnap(tmp_path / "birdsnap")
    with pytest.raises(DatasetError, match=r"has the splits test \(asked for 'train'\)"):
        open_dataset("birdsnap", str(root), "train", None)
    (root / "Alder_Flycatcher" / "55.jpg").unlink()
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "birdsnap", "--dataset_root",
                            str(root), "--quiet", "--orchestrator", "local"], capsys)
    assert_refused(code, err, "55.jpg (named in test_images_valid.txt) not found")
    listed = (root / "test_images_valid.txt").read_text()
    (root / "test_images_valid.txt").write_text(listed + "Blue_Jay/1.jpg\n")
    with pytest.raises(DatasetError, match=r"line 11: 'Blue_Jay/1.jpg' is in folder 'Blue_Jay', which no row of "
                                           r"species.txt names"):
        open_dataset("birdsnap", str(root), "test", None)
    (root / "species.txt").unlink()
    with pytest.raises(DatasetError, match=r"species.txt not found \(the Birdsnap lists InternVL's"):
        open_dataset("birdsnap", str(root), "test", None)


def test_a_repeated_folder_name_labels_with_its_last_row(tmp_path):
    root = write_birdsnap(tmp_path / "birdsnap")
    rows = ["id\tcommon\tscientific\tdir", *("\t".join(r) for r in SPECIES), "5\tAcadian Again\tx\tacadian_flycatcher"]
    (root / "species.txt").write_text("\n".join(rows) + "\n")
    ds = open_dataset("birdsnap", str(root), "test", None)
    assert len(ds.prompts.classnames) == 5 and ds.labels.tolist()[1] == 4  # as the fork's dict keeps the last


def test_scores_equal_clip_benchmark(tmp_path, tiny_model_dir):
    from clip_benchmark.metrics import zeroshot_classification

    root = write_birdsnap(tmp_path / "birdsnap")
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{tiny_model_dir}", device="cpu")
    model.eval()
    loader = torch.utils.data.DataLoader(Listed(root, transform), batch_size=4, shuffle=False, num_workers=0)
    theirs = zeroshot_classification.evaluate(model, loader, open_clip.get_tokenizer(f"local-dir:{tiny_model_dir}"),
                                              [row[1] for row in SPECIES], ["a photo of a {c}, a type of bird."],
                                              "cpu", amp=False)
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           amp=False, precision="fp32")
    scored = evaluate_one("zeroshot_classification", session, DataSource("birdsnap", str(root), "test"),
                          EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(4, 2),
                          score=ScoreSettings(batch_size=4))
    assert np.isnan(theirs["acc5"])  # fewer than 5 classes: clip_benchmark leaves top-5 undefined, and so do we
    for key, value in theirs.items():
        assert scored.metrics[key] == pytest.approx(value, abs=1e-12, nan_ok=True), key


def test_the_seeds_birdsnap_command_equals_clip_benchmark(tmp_path, monkeypatch, capsys):
    from clip_benchmark.metrics import zeroshot_classification
    from transformers import CLIPImageProcessor

    monkeypatch.chdir(tmp_path)
    folder = "./pretrained/InternVL-14B-224px"
    make_internvl_folder(tmp_path / "pretrained" / "InternVL-14B-224px")
    write_birdsnap(tmp_path / "data" / "birdsnap")
    code, _, err = run_cli([*shlex.split(SEED.format(folder=folder)), "--trust_remote_code", "--quiet",
                            "--orchestrator", "local"], capsys)
    assert code == 0, err
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["dataset"] == "birdsnap" and result["model"] == "internvl_c_classification"
    model, tokenize, _ = fork_retrieval_wiring(folder, "InternVL-C")
    processor = CLIPImageProcessor.from_pretrained(folder)  # classification: the folder's resize + centre crop

    def transform(image):
        return processor(images=image, return_tensors="pt").pixel_values[0]

    loader = torch.utils.data.DataLoader(Listed(tmp_path / "data" / "birdsnap", transform), batch_size=4)
    theirs = zeroshot_classification.evaluate(model, loader, tokenize, [row[1] for row in SPECIES],
                                              ["a photo of a {c}, a type of bird."], "cpu", amp=False)
    assert result["metrics"]["acc5"] is None and np.isnan(theirs.pop("acc5"))  # JSON has no NaN: null
    for key, value in theirs.items():
        assert result["metrics"][key] == pytest.approx(value, abs=1e-9), key
