"""Write tasks/datasets/prompts/imagenet1k.json (ImageNet-1k class names and zero-shot templates per language) and
tasks/datasets/prompts/clip_benchmark.json (every dataset's class names and templates per language, as shipped).

    .venv/bin/python scripts/extract_language_data.py

Source: the data files of LAION clip_benchmark 1.6.2 (MIT licence), `clip_benchmark/datasets/<lang>_classnames.json`
and `<lang>_zeroshot_classification_templates.json`, key `imagenet1k`. Run once; the output is committed.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import clip_benchmark

LANGUAGES = ("en", "cn", "jp", "ar", "it")


def main() -> None:
    folder = Path(clip_benchmark.__file__).parent / "datasets"
    out = {"_provenance": f"LAION clip_benchmark {version('clip-benchmark')} (MIT licence): "
                          f"datasets/<lang>_classnames.json and <lang>_zeroshot_classification_templates.json, "
                          f"key imagenet1k; extracted by scripts/extract_language_data.py"}
    for lang in LANGUAGES:
        names = json.loads((folder / f"{lang}_classnames.json").read_text(encoding="utf-8"))["imagenet1k"]
        templates = json.loads((folder / f"{lang}_zeroshot_classification_templates.json").read_text(
            encoding="utf-8"))["imagenet1k"]
        assert len(names) == 1000 and all("{c}" in t for t in templates), lang
        out[lang] = {"classnames": names, "templates": templates}
    target = Path(__file__).resolve().parents[1] / "tasks" / "datasets" / "prompts" / "imagenet1k.json"
    target.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {target} ({target.stat().st_size:,} bytes)")
    everything = {"_provenance": f"LAION clip_benchmark {version('clip-benchmark')} (MIT licence): "
                                 f"datasets/<lang>_classnames.json and <lang>_zeroshot_classification_templates.json, "
                                 f"every key; extracted by scripts/extract_language_data.py"}
    for lang in LANGUAGES:
        everything[lang] = {
            "classnames": json.loads((folder / f"{lang}_classnames.json").read_text(encoding="utf-8")),
            "templates": json.loads((folder / f"{lang}_zeroshot_classification_templates.json").read_text(
                encoding="utf-8"))}
    target = target.with_name("clip_benchmark.json")
    target.write_text(json.dumps(everything, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {target} ({target.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
