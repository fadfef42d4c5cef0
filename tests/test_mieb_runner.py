"""mieb:<task>: mteb's own task objects (CIFAR10ZeroShot, CIFAR10Clustering, Flickr30kI2TRetrieval) over local
copies in the layout mteb loads from the hub, with the tiny model behind mteb's encoder protocol through the cache:
the numbers equal ``mteb.evaluate`` with the same model uncached, a re-run does no forward pass (and loads no
model), two tasks over the same images share every image vector, results reach the warehouse, and bad names and an
unreachable hub are one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clipcache import connect
from clipcache.flows.cli import main
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import ConfigError, DatasetError
from clipcache.tasks.contract import CacheMissError
from clipcache.tasks.datasets import check_name, default_task, shapes
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.score.metrics import flat_metric_name, split_metric_name

from mieb_fixtures import BATCH, RETRIEVAL_README, mteb_uncached, session, write_configs, write_split

N_IMAGES = 48


def write_cifar10_copy(root, n=N_IMAGES):
    """mteb/cifar10's hub layout (data/test-*.parquet; columns img, label as a ClassLabel), with shapes images and
    class names: what CIFAR10ZeroShot and CIFAR10Clustering both load. The last 4 rows repeat the first 4 images."""
    from datasets import ClassLabel, Dataset, Features, Image

    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", n - 4)
    images = [ds.load_image(i) for i in range(len(ds))]
    labels = [int(v) for v in ds.labels]
    table = Dataset.from_dict({"img": images + images[:4], "label": labels + labels[:4]},
                              features=Features({"img": Image(), "label": ClassLabel(names=list(shapes.CLASSNAMES))}))
    write_split(root, "test", table)
    return root


def write_flickr_i2t_copy(root, n=16):
    """mteb/flickr30ki2t's layout: configs corpus (id, text), queries (id, image) and default (qrels), named in the
    README as the hub repository names them. Images: the first shapes classification images (shared with the
    CIFAR copy); captions: shapes captions."""
    from datasets import Dataset, Features, Image, Value

    cls = shapes.load_shapes("fixture", "zeroshot_classification", "test", n)
    ret = shapes.load_shapes("fixture", "zeroshot_retrieval", "test", n)
    corpus_ids, texts, qrels = [], [], []
    for q, captions in enumerate(ret.captions or []):
        for j, text in enumerate(captions):
            corpus_ids.append(f"d{q}-{j}")
            texts.append(text)
            qrels.append((f"q{q}", f"d{q}-{j}"))
    parts = {
        "corpus": Dataset.from_dict({"id": corpus_ids, "text": texts}),
        "queries": Dataset.from_dict({"id": [f"q{i}" for i in range(n)], "image": [cls.load_image(i) for i in range(n)]},
                                     features=Features({"id": Value("string"), "image": Image()})),
        "default": Dataset.from_dict({"query-id": [q for q, _ in qrels], "corpus-id": [d for _, d in qrels],
                                      "score": [1] * len(qrels)}),
    }
    return write_configs(root, parts, RETRIEVAL_README)


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    base = tmp_path_factory.mktemp("mieb")
    return {"CIFAR10ZeroShot": write_cifar10_copy(base / "cifar10"), "CIFAR10Clustering": base / "cifar10",
            "Flickr30kI2TRetrieval": write_flickr_i2t_copy(base / "flickr30ki2t")}


def counting(model_session, monkeypatch):
    """Count the images and texts the loaded model encodes, where every path of the bundled (two-tower) model goes
    through: ``image_features_and_norms`` and ``encode_texts_with_norms``, and the pools' ``encode_*_with_raw``."""
    counts = {"images": 0, "texts": 0}
    model = model_session.model

    def counted(kind, original):
        def call(batch):
            counts[kind] += len(batch)
            return original(batch)
        return call

    monkeypatch.setattr(model, "image_features_and_norms", counted("images", model.image_features_and_norms))
    monkeypatch.setattr(model, "encode_texts_with_norms", counted("texts", model.encode_texts_with_norms))
    monkeypatch.setattr(model, "encode_images_with_raw", counted("images", model.encode_images_with_raw))
    monkeypatch.setattr(model, "encode_texts_with_raw", counted("texts", model.encode_texts_with_raw))
    return counts


@pytest.mark.parametrize("name", ["CIFAR10ZeroShot", "CIFAR10Clustering", "Flickr30kI2TRetrieval"])
def test_equal_to_mteb_evaluate_uncached_and_a_rerun_encodes_nothing(name, copies, tmp_path, monkeypatch):
    model_session, memo = session()
    counts = counting(model_session, monkeypatch)
    store = EmbeddingStore(tmp_path / "cache")
    source = DataSource(f"mieb:{name}", str(copies[name]))
    scored = evaluate_one("mieb", model_session, source, store, memo, encode=EncodeSettings(BATCH, 0))
    cold = dict(counts)
    theirs, encoder = mteb_uncached(name, copies[name], model_session.model)
    encoded = encoder.counts
    ours = {k.removeprefix("mteb_"): v for k, v in scored.metrics.items()}
    numbers = {k: v for k, v in theirs.items() if v is None or isinstance(v, int | float)}
    assert set(ours) == set(numbers) and len(numbers) >= 5  # every number mteb reports, and nothing else
    for key, value in numbers.items():
        if value is None or np.isnan(value):
            assert np.isnan(ours[key]), key
        else:
            assert ours[key] == pytest.approx(value, abs=1e-6), key
    assert ours["main_score"] == pytest.approx(theirs["main_score"], abs=1e-6)
    assert 0 < ours["main_score"] < 1 or name != "CIFAR10ZeroShot"  # not a trivial set
    # each distinct image once (the CIFAR copy repeats 4), each distinct text once
    images = N_IMAGES - 4 if name.startswith("CIFAR10") else 16
    assert cold["images"] == images and encoded.images_encoded == (N_IMAGES if name.startswith("CIFAR") else 16)
    assert cold["texts"] <= encoded.texts_encoded and (cold["texts"] > 0) == (name != "CIFAR10Clustering")

    again, _ = session()  # a new session: nothing may load the model
    rerun = evaluate_one("mieb", again, source, store, memo, encode=EncodeSettings(BATCH, 0))
    assert again.loads == 0
    assert rerun.metrics.keys() == scored.metrics.keys()
    assert all(np.isnan(v) and np.isnan(scored.metrics[k]) or v == scored.metrics[k] for k, v in rerun.metrics.items())


def test_two_tasks_over_the_same_images_share_every_image_vector(copies, tmp_path, monkeypatch):
    model_session, memo = session()
    counts = counting(model_session, monkeypatch)
    store = EmbeddingStore(tmp_path / "cache")
    evaluate_one("mieb", model_session, DataSource("mieb:CIFAR10ZeroShot", str(copies["CIFAR10ZeroShot"])), store,
                 memo, encode=EncodeSettings(BATCH, 0))
    first = dict(counts)
    keys = set(store.keys())
    evaluate_one("mieb", model_session, DataSource("mieb:CIFAR10Clustering", str(copies["CIFAR10Clustering"])),
                 store, memo, encode=EncodeSettings(BATCH, 0))
    assert counts == first and set(store.keys()) == keys  # clustering: every image from the zero-shot run's entry
    # the retrieval copy's query images are the same 16 shapes images: only its captions are new
    evaluate_one("mieb", model_session, DataSource("mieb:Flickr30kI2TRetrieval",
                                                   str(copies["Flickr30kI2TRetrieval"])),
                 store, memo, encode=EncodeSettings(BATCH, 0))
    assert counts["images"] == first["images"] and counts["texts"] > first["texts"]


def test_rescore_uses_the_cache_alone(copies, tmp_path):
    model_session, memo = session()
    store = EmbeddingStore(tmp_path / "cache")
    source = DataSource("mieb:CIFAR10Clustering", str(copies["CIFAR10Clustering"]))
    with pytest.raises(CacheMissError, match=r"44 image embeddings of mteb task CIFAR10Clustering"):
        evaluate_one("mieb", model_session, source, store, memo, encode=EncodeSettings(BATCH, 0, cached_only=True))
    evaluate_one("mieb", model_session, source, store, memo, encode=EncodeSettings(BATCH, 0))
    again, _ = session()
    scored = evaluate_one("mieb", again, source, store, memo, encode=EncodeSettings(BATCH, 0, cached_only=True))
    assert again.loads == 0 and "mteb_nmi" in scored.metrics


def test_cli_writes_the_experiment_to_the_warehouse(copies, tmp_path, monkeypatch):
    import datasets.config

    home = tmp_path / "home-cache"  # stands for ~/.cache/huggingface/datasets: nothing may be written there
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home)

    def cli(*extra):
        return main(["eval", "--model", "tiny-shapes-clip", "--dataset", "mieb:CIFAR10ZeroShot", "--dataset_root",
                     str(copies["CIFAR10ZeroShot"]), "--orchestrator", "local", "--quiet", "--batch_size", str(BATCH),
                     "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), *extra])

    assert check_name("mieb:CIFAR10ZeroShot") is None and default_task("mieb:CIFAR10ZeroShot", None) == "mieb"
    assert cli() == 0
    [path] = (tmp_path / "out" / "tiny-shapes-clip").glob("*.json")
    saved = json.loads(path.read_text())
    assert saved["task"] == "mieb" and saved["dataset"] == "mieb:CIFAR10ZeroShot"
    assert {"mteb_accuracy", "mteb_f1", "mteb_main_score"} <= set(saved["metrics"])
    assert saved["metrics"]["mteb_ap"] is None  # mteb leaves it undefined for more than two classes
    con = connect(str(tmp_path / "out"))
    rows = dict(con.execute("SELECT metric, value FROM metrics WHERE task = 'mieb'").fetchall())
    assert rows["mteb_main_score"] == saved["metrics"]["mteb_main_score"] == saved["metrics"]["mteb_accuracy"]
    assert cli("--output_dir", str(tmp_path / "again")) == 0  # from the cache
    [again] = (tmp_path / "again" / "tiny-shapes-clip").glob("*.json")
    repeat = json.loads(again.read_text())
    assert repeat["metrics"] == saved["metrics"] and repeat["experiment_id"] == saved["experiment_id"]
    assert not home.exists() and list((tmp_path / "cache").rglob("hf_datasets"))  # datasets' Arrow copy: --cache_dir
    assert datasets.config.HF_DATASETS_CACHE == home  # set back after loading


def test_mteb_metric_names_split_k_and_round_trip():
    info, k = split_metric_name("mteb_ndcg_at_10", {})
    assert (info.name, k, info.higher_is_better) == ("mteb_ndcg", 10, True)
    assert flat_metric_name(info.name, k) == "mteb_ndcg_at_10"
    assert split_metric_name("mteb_main_score", {})[0].name == "mteb_main_score"
    assert split_metric_name("mteb_main_score", {})[1] is None


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_an_unknown_task_is_one_line_with_a_suggestion(tmp_path):
    model_session, memo = session()
    with pytest.raises(DatasetError) as e:
        evaluate_one("mieb", model_session, DataSource("mieb:CIFAR10ZeroShto", str(tmp_path)),
                     EmbeddingStore(tmp_path / "cache"), memo)
    assert one_line(e) == "Unknown MIEB task 'CIFAR10ZeroShto' (mieb:<mteb task name>). Did you mean: 'CIFAR10ZeroShot'?"


def test_an_unreachable_hub_is_one_line_naming_what_to_fetch(tmp_path):
    model_session, memo = session()
    with pytest.raises(DatasetError) as e:
        evaluate_one("mieb", model_session, DataSource("mieb:CIFAR10ZeroShot"), EmbeddingStore(tmp_path / "c"), memo)
    message = one_line(e)
    assert message.startswith("mieb:CIFAR10ZeroShot: the Hugging Face hub is unreachable")
    assert "hf download mteb/cifar10 --repo-type dataset --revision 69a62dd171e24a133d193073e73fda4dbb823266" in message


@pytest.mark.parametrize("source, message", [
    (DataSource("mieb:CIFAR10ZeroShot", "{root}", split="train"),
     "mieb:CIFAR10ZeroShot evaluates split test, not 'train': pass --split test"),
    (DataSource("mieb:CIFAR10ZeroShot", "{root}", limit=5),
     "mieb:CIFAR10ZeroShot: --limit does not apply; mteb evaluates its task's whole split"),
    (DataSource("mieb:", "{root}"), "dataset 'mieb:': an mteb task is named mieb:<task name>, e.g. mieb:CIFAR10ZeroShot"),
])
def test_settings_mteb_cannot_honour_are_one_line(source, message, copies, tmp_path):
    from dataclasses import replace

    model_session, memo = session()
    source = replace(source, root=str(copies["CIFAR10ZeroShot"]))
    with pytest.raises((DatasetError, ConfigError)) as e:
        evaluate_one("mieb", model_session, source, EmbeddingStore(tmp_path / "cache"), memo)
    assert one_line(e) == message


def test_a_save_to_disk_copy_loads_too(copies, tmp_path):
    from datasets import load_dataset

    table = load_dataset(str(copies["CIFAR10ZeroShot"]), split="test")
    table.save_to_disk(str(tmp_path / "saved"))
    model_session, memo = session()
    store = EmbeddingStore(tmp_path / "cache")
    a = evaluate_one("mieb", model_session, DataSource("mieb:CIFAR10ZeroShot", str(tmp_path / "saved")), store, memo,
                     encode=EncodeSettings(BATCH, 0))
    b = evaluate_one("mieb", model_session, DataSource("mieb:CIFAR10ZeroShot", str(copies["CIFAR10ZeroShot"])), store,
                     memo, encode=EncodeSettings(BATCH, 0))
    assert a.metrics.keys() == b.metrics.keys()
    assert all(np.isnan(v) and np.isnan(b.metrics[k]) or v == b.metrics[k] for k, v in a.metrics.items())
    with pytest.raises(DatasetError) as e:
        evaluate_one("mieb", model_session, DataSource("mieb:Flickr30kI2TRetrieval", str(tmp_path / "saved")), store,
                     memo)
    assert "a save_to_disk folder holds one dataset" in one_line(e)
