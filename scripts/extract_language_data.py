"""Write tasks/datasets/clip_benchmark/prompts/imagenet1k.json (ImageNet-1k class names and zero-shot templates per
language) and tasks/datasets/clip_benchmark/prompts/clip_benchmark.json (every dataset's class names and templates per
language, as shipped).

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
    prompts = Path(__file__).resolve().parents[1] / "tasks" / "datasets" / "clip_benchmark" / "prompts"
    target = prompts / "imagenet1k.json"
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
    write_dataset_facts(folder, target.with_name("clip_benchmark_sets.json"))
    write_babel_imagenet(folder, target.with_name("babel_imagenet.json"))


def write_babel_imagenet(folder: Path, target: Path) -> None:
    """Babel-ImageNet: per language, the ImageNet class indices it keeps and their names (babel_imagenet.json), and
    the NLLB-translated templates (nllb_dist13b_prompts.json, ``{}`` written ``{c}``); only the languages that have
    both, as clip_benchmark can evaluate no other."""
    classes = json.loads((folder / "babel_imagenet.json").read_text(encoding="utf-8"))
    templates = json.loads((folder / "nllb_dist13b_prompts.json").read_text(encoding="utf-8"))
    out = {"_provenance": f"LAION clip_benchmark {version('clip-benchmark')} (MIT licence), from Babel-ImageNet "
                          f"(https://github.com/gregor-ge/Babel-ImageNet): datasets/babel_imagenet.json and "
                          f"nllb_dist13b_prompts.json, languages present in both; extracted by "
                          f"scripts/extract_language_data.py",
           "languages": {lang.lower(): {"indices": classes[lang][0], "classnames": classes[lang][1],
                                        "templates": [t.replace("{}", "{c}") for t in templates[lang]]}
                         for lang in sorted(set(classes) & set(templates))}}
    target.write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {target} ({target.stat().st_size:,} bytes)")


def write_dataset_facts(folder: Path, target: Path) -> None:
    """The ImageNet variants' WordNet-id subsets (literals in builder.py) and the languages of the multilingual
    retrieval sets (each module's SUPPORTED_LANGUAGES)."""
    import ast
    import importlib

    tree = ast.parse((folder / "builder.py").read_text(encoding="utf-8"))
    subsets = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("imagenet_a_wnids", "imagenet_r_wnids", "imagenet_o_wnids"):
                subsets["imagenet-" + name.split("_")[1]] = sorted(ast.literal_eval(node.value))
    assert sorted(subsets) == ["imagenet-a", "imagenet-o", "imagenet-r"] and all(len(v) == 200 for v in subsets.values())
    modules = {"multilingual_mscoco_captions": "multilingual_mscoco", "crossmodal3600": "crossmodal3600",
               "xtd10": "xtd10", "xtd200": "xtd200", "flickr30k-200": "flickr30k_200"}
    retrieval = {}
    for dataset, module in modules.items():
        mod = importlib.import_module(f"clip_benchmark.datasets.{module}")
        retrieval[dataset] = {"module": f"clip_benchmark.datasets.{module}",
                              "file": mod.OUTPUT_FILENAME_TEMPLATE.replace("{}", "{language}"),
                              "languages": list(mod.SUPPORTED_LANGUAGES)}
    facts = {"_provenance": f"LAION clip_benchmark {version('clip-benchmark')} (MIT licence): datasets/builder.py "
                            f"imagenet_{{a,r,o}}_wnids (sorted) and each multilingual retrieval module's "
                            f"OUTPUT_FILENAME_TEMPLATE and SUPPORTED_LANGUAGES; extracted by "
                            f"scripts/extract_language_data.py",
             "imagenet_subsets": subsets, "multilingual_retrieval": retrieval}
    target.write_text(json.dumps(facts, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {target} ({target.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
