"""multiple_choice (MIEB's Any2AnyMultipleChoice, CV-Bench's rule): shapes questions scored equal to mteb's own
CVBenchCount evaluation (fused image+question queries reranked over their choices, pytrec_eval's accuracy) on the
same cached embeddings, question by question; pytrec_eval's tie order on a hand-computed case and on a real tie;
warehouse rows that recompute acc1; a rescore that loads no model; bad input in one line."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
import torch

from clipcache import connect
from clipcache.flows.cli import main
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import check_name, default_task, shapes
from clipcache.tasks.datasets.mieb.mieb_layouts import open_multiple_choice
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.score.multiple_choice import choice_outcomes

NAMES = shapes.CLASSNAMES  # "red circle", "red square", ...
TIE_QUESTION = 2


def questions(n: int = 20) -> tuple[list[dict], Any]:
    """Shapes images asked what they show. The first three questions set up a tie that only pytrec_eval's order
    decides: "Red circle" is the 10th distinct choice text (corpus-test-9), "red circle" the 11th (corpus-test-10),
    and the tokenizer lowercases, so they embed alike; as text "9" ranks above "10", so "Red circle" wins."""
    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", 80)
    labels = [int(x) for x in ds.labels]
    red = labels.index(NAMES.index("red circle"))
    first = next(i for i, label in enumerate(labels) if label > 8)
    nine = [NAMES[labels[first]], *[c for c in NAMES[1:] if c != NAMES[labels[first]]][:8]]
    records = [{"image": first, "question": "what is drawn?", "choices": nine, "answer": 0},
               {"image": red, "question": "which shape is this?", "choices": [nine[3], "Red circle"], "answer": "(B)"},
               {"image": red, "question": "what is drawn?", "choices": ["red circle", "Red circle", "blue square"],
                "answer": 1}]
    rng = np.random.default_rng(0)
    for k in range(n - 3):
        i = 3 + k - k % 2  # each image asked twice
        right = NAMES[labels[i]]
        choices = [right, *[str(c) for c in rng.choice([c for c in NAMES if c != right], 3, replace=False)]]
        rng.shuffle(choices)
        records.append({"image": i, "question": "which shape is this?" if k % 2 else "what is drawn?",
                        "choices": choices, "answer": choices.index(right)})
    return [{"id": f"q{k}", **r} for k, r in enumerate(records)], ds


def write_questions(root, n=20):
    records, ds = questions(n)
    root.mkdir(parents=True, exist_ok=True)
    for r in records:
        ds.load_image(r["image"]).save(root / f"{r['image']}.png")
    lines = [json.dumps({**r, "image": f"{r['image']}.png"}) for r in records]
    (root / "questions.jsonl").write_text("\n".join(lines) + "\n")
    return root


def session():
    memo = FileHashMemo(None)
    return ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                        amp=False, precision="fp32"), memo


def test_pytrec_eval_tie_order_on_a_hand_computed_case():
    """Choice rows 10 and 9 tie at the top: document ids descend as text, so row 9 wins though listed second and
    though 10 > 9; a duplicated choice text is one document; the margin is NaN without a rival text."""
    choices = np.zeros((12, 2), np.float32)
    choices[:, 1] = 1  # far from the query
    choices[9] = choices[10] = [1, 0]
    choices[11] = [0.6, 0.8]
    outcomes = choice_outcomes(np.array([[1, 0], [1, 0], [0, 1]], np.float32), np.zeros((3, 2), np.float32),
                               choices, [np.array([10, 9, 11]), np.array([11, 10, 9]), np.array([5, 5])],
                               np.array([1, 1, 1]))
    assert outcomes["prediction"].tolist() == [1, 2, 0] and outcomes["correct1"].tolist() == [True, False, True]
    assert outcomes["tied"].tolist() == [True, True, False] and outcomes["rank"].tolist() == [1, 2, 1]
    assert outcomes["score"].tolist() == [1, 1, 1]
    assert outcomes["margin"][:2].tolist() == [0, 0] and np.isnan(outcomes["margin"][2])


def test_equal_to_mteb_cv_bench_on_the_cached_embeddings(tmp_path, monkeypatch):
    import datasets
    from mteb._evaluators.retrieval_evaluator import RetrievalEvaluator
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.tasks.multichoice.eng.cv_bench import CVBenchCount, _load_data

    root = write_questions(tmp_path / "mc")
    check_name("shapes_qa", str(root))
    assert default_task("shapes_qa", str(root)) == "multiple_choice"
    model_session, memo = session()
    store = EmbeddingStore(tmp_path / "cache")
    scored = evaluate_one("multiple_choice", model_session, DataSource("shapes_qa", str(root)), store, memo,
                          encode=EncodeSettings(8, 0))
    data = open_multiple_choice("shapes_qa", root, "test", None)
    # the raw features (row x norm): what mteb's OpenCLIP wrapper hands its evaluator and sums for image + text
    entries = {store.open(k).attrs["key_fields"]["role"]: store.open(k).raw_embeddings("test") for k in store.keys()}
    assert {r: len(v) for r, v in entries.items()} == {"question_image": len(data.images), "question_text": 2,
                                                        "choice_text": len(data.choices)}
    assert len(data.images) < 20 and data.choices[9:11] == ["Red circle", "red circle"]
    pixels = {}
    for i in range(len(data.images)):
        image = data.images.load_image(i)
        pixels[image.size, image.tobytes()] = entries["question_image"][i]
    texts = {**dict(zip(data.questions, entries["question_text"], strict=True)),
             **dict(zip(data.choices, entries["choice_text"], strict=True))}

    class CachedEncoder(AbsEncoder):
        """mteb's OpenCLIP wrapper's encode (an image+text input: text_embeddings + image_embeddings) over the
        cached vectors."""

        def __init__(self):
            pass

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            features, text, image = inputs.dataset.features, None, None
            if "text" in features:
                text = torch.from_numpy(np.stack([texts[t] for batch in inputs for t in batch["text"]]))
            if "image" in features:
                image = torch.from_numpy(np.stack([pixels[i.convert("RGB").size, i.convert("RGB").tobytes()]
                                                   for batch in inputs for i in batch["image"]]))
            return text + image if text is not None and image is not None else text if text is not None else image

    # CV-Bench's hub layout (mteb/CV-Bench), which mteb's own loader reads and turns into queries, corpus and qrels
    records, _ = questions()
    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    extra = ("type", "prompt", "filename", "source", "source_dataset", "source_filename", "target_class", "bbox")
    features = datasets.Features({"idx": datasets.Value("int64"), "task": datasets.Value("string"),
                                  "image": datasets.Image(), "question": datasets.Value("string"),
                                  "choices": datasets.Sequence(datasets.Value("string")),
                                  "answer": datasets.Value("string"), "target_size": datasets.Value("int64"),
                                  **{c: datasets.Value("string") for c in extra}})
    letters = "ABCDEFGHIJ"
    datasets.Dataset.from_dict({
        "idx": list(range(len(records))), "task": ["Count"] * len(records),
        "image": [str(root / f"{r['image']}.png") for r in records], "question": [r["question"] for r in records],
        "choices": [r["choices"] for r in records],
        "answer": [r["answer"] if isinstance(r["answer"], str) else f"({letters[r['answer']]})" for r in records],
        "target_size": [0] * len(records), **{c: [""] * len(records) for c in extra}},
        features=features).to_parquet(str(hub / "test-00000-of-00001.parquet"))
    task = CVBenchCount()
    task.corpus, task.queries, task.relevant_docs, task.top_ranked = _load_data(
        path=str(hub.parent), splits=["test"], subtask="Count")
    task.data_loaded = True
    results: dict = {}
    search = RetrievalEvaluator.__call__

    def keep_results(self, *args, **kwargs):
        results.update(search(self, *args, **kwargs))
        return results

    monkeypatch.setattr(RetrievalEvaluator, "__call__", keep_results)
    theirs = task.evaluate(CachedEncoder(), "test", encode_kwargs={"batch_size": 8, "show_progress_bar": False})
    assert round(scored.metrics["acc1"], 5) == theirs["default"]["accuracy"]  # mteb rounds to 5 decimals
    # question by question: mteb's similarities, and the top document as pytrec_eval orders them
    rows = scored.evidence.columns
    corpus = dict(zip(task.dataset["default"]["test"]["corpus"]["id"],
                      task.dataset["default"]["test"]["corpus"]["text"], strict=True))
    for q, record in enumerate(records):
        ranked = sorted(results[f"query-test-{q}"].items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        assert corpus[ranked[0][0]] == record["choices"][rows["prediction"][q]] and ranked[0][1] == rows["score"][q]
    assert rows["tied"][TIE_QUESTION] and rows["correct1"][TIE_QUESTION] and scored.tied == {"acc1": 1}
    assert scored.metrics["acc1"] > 0.6  # a trained model, above chance


def cli(command, root, tmp_path, *extra):
    return main([command, "--model", "tiny-shapes-clip", "--dataset", "shapes_qa", "--dataset_root", str(root),
                 "--task", "multiple_choice", "--orchestrator", "local", "--quiet", "--output_dir",
                 str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), *extra])


def test_cli_warehouse_rows_recompute_acc1_and_rescore_loads_no_model(tmp_path, capsys, monkeypatch):
    root = write_questions(tmp_path / "mc")
    assert cli("eval", root, tmp_path) == 0
    saved = json.loads((tmp_path / "out" / "tiny-shapes-clip" / "shapes_qa_multiple_choice.json").read_text())
    assert saved["task"] == "multiple_choice" and set(saved["metrics"]) == {"acc1"}
    con = connect(str(tmp_path / "out"))
    [(value, low, high, tied)] = con.execute("SELECT value, ci_low, ci_high, tied_queries FROM metrics WHERE task = "
                                             "'multiple_choice' AND metric = 'acc' AND k = 1").fetchall()
    s = con.sql("SELECT * FROM latest_samples WHERE task = 'multiple_choice' AND unit = 'example' "
                "ORDER BY sample_index").to_arrow_table().to_pydict()
    records, _ = questions()
    assert s["sample_index"] == list(range(20)) and s["sample_key"] == [r["id"] for r in records]
    assert s["target"] == [1 if isinstance(r["answer"], str) else r["answer"] for r in records]
    assert np.mean(s["correct1"]) == value == saved["metrics"]["acc1"] and low <= value <= high
    assert tied == sum(s["tied"]) == 1
    assert all((rank == 1) == right for rank, right in zip(s["rank"], s["correct1"], strict=True))
    assert all((p == t) == right for p, t, right in zip(s["prediction"], s["target"], s["correct1"], strict=True))
    capsys.readouterr()
    assert main(["cache", "--cache_dir", str(tmp_path / "cache"), "ls", "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(e["role"] for e in listed) == ["choice_text", "question_image", "question_text"]
    assert all(e["tasks"] == ["multiple_choice"] for e in listed)

    def no_model(*args, **kwargs):
        raise AssertionError("rescore loaded the model")

    monkeypatch.setattr("clipcache.tasks.encode.stage.load_model", no_model)
    assert cli("rescore", root, tmp_path, "--output_dir", str(tmp_path / "again")) == 0
    again = json.loads((tmp_path / "again" / "tiny-shapes-clip" / "shapes_qa_multiple_choice.json").read_text())
    assert again["metrics"] == saved["metrics"]


@pytest.mark.parametrize("record, message", [
    ({"image": "nope.png", "question": "q", "choices": ["a", "b"], "answer": 0},
     r"questions.jsonl line 21: image 'nope.png' not found \(paths are relative to "),
    ("{not json", r"questions.jsonl line 21: not valid JSON"),
    ({"image": "3.png", "question": "q", "choices": ["a", "b"]},
     r"questions.jsonl line 21: expected an object with 'image' and 'question' and 'choices' and 'answer'"),
    ({"image": "3.png", "question": "q", "choices": "a, b", "answer": 0},
     r"questions.jsonl line 21: 'choices' must be a list of at least two strings"),
    ({"image": "3.png", "question": "q", "choices": ["a", "b"], "answer": 2},
     r"questions.jsonl line 21: 'answer' must be the index of a choice \(0 to 1\) or its letter"),
    ({"image": "3.png", "question": "q", "choices": ["a", "b"], "answer": "(C)"},
     r"questions.jsonl line 21: 'answer' must be .* \(got '\(C\)'\)"),
])
def test_bad_input_is_one_line(tmp_path, capsys, record, message):
    root = write_questions(tmp_path / "mc")
    with open(root / "questions.jsonl", "a") as f:
        f.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
    capsys.readouterr()
    assert cli("eval", root, tmp_path) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_limit_and_one_split(tmp_path):
    root = write_questions(tmp_path / "mc")
    data = open_multiple_choice("shapes_qa", root, "test", 3)
    assert len(data.answers) == 3 and len(data.images) == 2 and data.questions == ["what is drawn?",
                                                                                   "which shape is this?"]
    assert data.answers.tolist() == [0, 1, 1] and data.keys == ["q0", "q1", "q2"]
    with pytest.raises(DatasetError, match=r"questions.jsonl holds one split, 'test' \(asked for 'val'\)"):
        open_multiple_choice("shapes_qa", root, "val", None)


def test_a_question_with_an_undecodable_image_is_not_asked(tmp_path):
    root = write_questions(tmp_path / "mc")
    (root / "3.png").write_bytes(b"not an image")
    model_session, memo = session()
    scored = evaluate_one("multiple_choice", model_session, DataSource("shapes_qa", str(root)),
                          EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(8, 0, "skip"))
    asked = scored.evidence.columns["sample_index"].tolist()
    assert scored.metrics["skipped_images"] == 1 and asked == [0, 1, 2, *range(5, 20)]
