"""Caption setups (captions a CoCa generated, or a VLM wrote through convert) in `clipcache cache`: listed with their
model, decoding settings, images and size, shown by `info`, checked by `verify`, deleted by `rm` and collected by
`gc` like embedding entries, a setup in use by another process kept. No model: the setups are written as the
caption cache writes them (tests/test_captioning.py lists a real CoCa's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clipcache.storage.caption_cache import CaptionCache, caption_setups
from clipcache.tasks.convert.captioner import CaptionSettings

from hostile import assert_refused, run_cli

COCA = {"generator": "open_clip.generate", "model": "coca_ViT-B-32@mscoco_finetuned_laion2b_s13b_b90k",
        "precision": "fp32", "decoding": {"generation_type": "top_k", "seq_len": 30, "top_p": 0.1, "top_k": 1,
                                          "temperature": 1.0}}
VLM = CaptionSettings("qwen2-vl", "http://127.0.0.1:9/v1", "Describe this image", max_tokens=64).cache_setup()


def image(i: int) -> str:
    return f"{i:064x}"


@pytest.fixture
def cache(tmp_path):
    root = tmp_path / "cache"
    (root / "embeddings").mkdir(parents=True)
    coca = CaptionCache(root, COCA)
    for i in range(3):
        coca.put(image(i), f"a photo of thing {i}")
    vlm = CaptionCache(root, VLM)
    vlm.put(image(7), "a red circle")
    return root, coca, vlm


def cli(root, capsys, *argv):
    return run_cli(["cache", *argv, "--cache_dir", str(root)], capsys)


def test_ls_lists_caption_setups_with_model_settings_images_and_size(cache, capsys):
    root, coca, vlm = cache
    code, out, err = cli(root, capsys, "ls", "--json")
    assert code == 0, err
    rows = {r["key"]: r for r in map(json.loads, out.splitlines())}
    assert set(rows) == {coca.key, vlm.key}
    row = rows[coca.key]
    assert (row["kind"], row["model"], row["count"], row["tasks"]) == ("captions", COCA["model"], 3, ["captioning"])
    assert row["settings"] == "generation_type=top_k, seq_len=30, top_p=0.1, top_k=1, temperature=1.0, precision=fp32"
    assert row["bytes"] == coca.path.stat().st_size + (root / "captions" / f"{coca.key}.setup.json").stat().st_size
    assert rows[vlm.key]["count"] == 1 and 'prompt=Describe this image' in rows[vlm.key]["settings"]
    code, out, _ = cli(root, capsys, "ls")
    assert "2 caption setups" in out and coca.key[:12] in out and "seq_len=30" in out
    code, out, _ = cli(root, capsys, "ls", "--json", "--task", "captioning")
    assert len(out.splitlines()) == 2
    code, out, _ = cli(root, capsys, "ls", "--json", "--task", "zeroshot_classification")
    assert out == ""
    code, out, _ = cli(root, capsys, "info", coca.key[:8])
    shown = json.loads(out)
    assert shown["setup"] == COCA and shown["images"] == 3 and shown["kind"] == "captions"


def test_verify_finds_an_edited_setup_and_a_damaged_line_and_deletes_on_request(cache, capsys):
    root, coca, vlm = cache
    code, out, _ = cli(root, capsys, "verify")
    assert code == 0 and "verified 0 entries and 2 caption setups: 0 damaged" in out
    with open(vlm.path, "ab") as f:
        f.write(b'{"image": "' + image(8).encode() + b'", "capt')  # a torn last line: an interrupted run, harmless
    code, out, _ = cli(root, capsys, "verify")
    assert code == 0, out
    setup_file = root / "captions" / f"{coca.key}.setup.json"
    setup_file.write_text(json.dumps({**COCA, "precision": "bf16"}))  # captions that were not made this way
    lines = vlm.path.read_text().splitlines(keepends=True)
    vlm.path.write_text("".join(lines[:1] + ['{"image": 3}\n'] + lines[1:]))
    code, out, _ = cli(root, capsys, "verify")
    assert code == 1
    assert f"{coca.key}: {coca.key}.setup.json: its content does not hash to its key" in out
    assert f"{vlm.key}: {vlm.key}.jsonl, line 2: not a caption record" in out
    assert "2 damaged" in out
    code, out, _ = cli(root, capsys, "verify", coca.key[:10], "--delete")
    assert code == 1 and f"deleted caption setup {coca.key}" in out
    assert not coca.path.exists() and not setup_file.exists() and vlm.path.exists()


@pytest.mark.parametrize("use", ["assert c.try_claim('" + image(9) + "')", "held = c.holding(); held.__enter__()"])
def test_rm_and_gc_delete_caption_setups_and_gc_keeps_one_in_use(cache, capsys, use):
    """In use: a conversion in another process holds a claim on an image it is asking the VLM about, or a model
    generating captions holds the setup as a whole (CaptionCache.holding)."""
    root, coca, vlm = cache
    code, out, _ = cli(root, capsys, "gc", "--pattern", "coca_*", "--dry_run")
    assert f"would delete {coca.key[:12]} captions {COCA['model']}" in out and coca.path.exists()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, json\n"
        "from clipcache.storage.caption_cache import CaptionCache\n"
        f"c = CaptionCache({str(root)!r}, json.loads({json.dumps(json.dumps(VLM))}))\n"
        f"{use}\n"
        "print('claimed', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        code, out, _ = cli(root, capsys, "gc", "--max_size", "0")
        assert code == 0
        assert f"deleted {coca.key[:12]} captions" in out and f"kept {vlm.key[:12]} captions" in out
        assert "in use by a running convert or generation" in out
        assert not coca.path.exists() and vlm.path.exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    code, out, _ = cli(root, capsys, "rm", vlm.key[:6])
    assert code == 0 and f"deleted caption setup {vlm.key}" in out
    assert caption_setups(root) == {} and not list((root / "captions").glob(f"{vlm.key}*"))


def test_a_prefix_names_one_entry_or_setup(cache, capsys):
    root, coca, _ = cache
    code, _, err = cli(root, capsys, "rm", "zz")
    assert_refused(code, err, "no entry or caption setup in")
    code, _, err = cli(root, capsys, "info", "")
    assert_refused(code, err, "with a key starting with ''")
    assert coca.path.exists()
