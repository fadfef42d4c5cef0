"""``clipcache`` command line. Flags follow LAION clip_benchmark (``--dataset a b c``, ``--recall_k 1 5 10``), which
is why this is argparse: click/typer options cannot take several values after one flag."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console

console = Console(stderr=True)
# Piped output would otherwise wrap the results table at 80 columns.
out = Console(width=None if sys.stdout.isatty() else 132)


def _flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """Accept clip_benchmark's ``--recall_k`` and the dashed ``--recall-k`` alike."""
    names = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    parser.add_argument(*names, dest=name, **kwargs)


def _eval_parser(sub: argparse._SubParsersAction, command: str = "eval") -> None:
    if command == "eval":
        p = sub.add_parser("eval", help="evaluate models on datasets (zero-shot classification / retrieval)",
                           description="Evaluate CLIP-style models; flags as in LAION clip_benchmark.")
    else:
        p = sub.add_parser("rescore", help="recompute metrics from cached embeddings only (same flags as eval)",
                           description="Recompute metrics from the cache: no image is decoded and the model is "
                                       "loaded only to encode class prompts it has never seen.")
    _flag(p, "model", nargs="+", required=True, help="open_clip architecture, local-dir:PATH, hf-hub:ORG/REPO, "
                                                     "HF/ModelScope id, local directory, or tiny-shapes-clip")
    _flag(p, "pretrained", nargs="+", default=None, help="open_clip pretrained tag or checkpoint (one, or one per "
                                                         "model)")
    _flag(p, "model_type", choices=["auto", "open_clip", "hf", "modelscope", "sentence_transformers"],
          default="auto")
    _flag(p, "arch_config", default=None, help="extra open_clip architecture JSON file or folder")
    _flag(p, "hub", choices=["huggingface", "modelscope"], default="huggingface",
          help="where ORG/NAME model ids and hosted datasets come from (default huggingface)")
    _flag(p, "offline", action="store_true", default=False, help="use only datasets already in --cache_dir")
    _flag(p, "dataset", nargs="+", required=True, help="shapes, shapes_retrieval, custom, wds/<name>, catalog name")
    _flag(p, "dataset_root", default=None, help="dataset folder or template with {dataset} / {dataset_cleaned}")
    _flag(p, "split", default="test")
    _flag(p, "task", choices=["auto", "zeroshot_classification", "zeroshot_retrieval", "text_retrieval"],
          default="auto", help="text_retrieval: --dataset_root is a BEIR folder (e.g. one written by convert)")
    _flag(p, "language", default="en")
    _flag(p, "classnames", default=None, help="class names file (JSON list or one per line) replacing the dataset's")
    _flag(p, "templates", default=None, help="templates file (JSON list or one per line, with {c}) replacing the "
                                             "dataset's")
    _flag(p, "recall_k", nargs="+", type=int, default=[1, 5, 10])
    _flag(p, "retrieval_metrics", nargs="+", choices=["recall", "mrr", "ndcg", "rank"], default=["recall"],
          help="retrieval metric families (default: recall, as clip_benchmark)")
    _flag(p, "batch_size", type=int, default=64)
    _flag(p, "num_workers", type=int, default=2)
    _flag(p, "limit", type=int, default=None, help="evaluate exactly the first N samples")
    amp = p.add_mutually_exclusive_group()
    amp.add_argument("--amp", dest="amp", action="store_true", default=False,
                     help="mixed precision: bf16 on CPU, fp16 on CUDA")
    amp.add_argument("--no_amp", "--no-amp", dest="amp", action="store_false", help="fp32 (default; parity)")
    _flag(p, "device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    _flag(p, "on_bad_image", choices=["error", "skip"], default="error")
    _flag(p, "output", default=None, help="also write clip_benchmark-style JSON to this path template, e.g. "
                                          "'{dataset}_{model}_{task}.json'")
    _flag(p, "output_dir", default="outputs")
    _flag(p, "cache_dir", default="cache")
    _flag(p, "model_cache_dir", default=None)
    _flag(p, "task_runner", default="none", help="none, threads, dask (local cluster) or dask://HOST:PORT: shard "
                                                 "encoding across workers")
    _flag(p, "workers", type=int, default=None, help="workers for threads / a local Dask cluster")
    _flag(p, "shard_rows", type=int, default=None, help="rows per encode shard")
    _flag(p, "skip_existing", action="store_true", default=False)
    _flag(p, "quiet", action="store_true", default=False, help="no progress bars")
    p.set_defaults(handler=_cmd_eval, cached_only=command == "rescore")


def _models_from_args(args: argparse.Namespace) -> list[dict[str, Any]]:
    from clipcache.storage.errors import ConfigError

    pretrained = args.pretrained or [None]
    if len(pretrained) not in (1, len(args.model)):
        raise ConfigError(f"--pretrained: give one value or one per model ({len(args.model)}), got {len(pretrained)}")
    if len(pretrained) == 1:
        pretrained = pretrained * len(args.model)
    return [{"model_name": m, "pretrained": p or None, "model_type": args.model_type, "arch_config": args.arch_config,
             "hub": args.hub} for m, p in zip(args.model, pretrained, strict=True)]


def _cmd_eval(args: argparse.Namespace) -> int:
    from clipcache.flows.params import EvaluateParams, validate

    params = validate(EvaluateParams, {
        "models": _models_from_args(args), "datasets": args.dataset, "dataset_root": args.dataset_root,
        "split": args.split, "task": args.task, "language": args.language, "recall_k": args.recall_k,
        "classnames": args.classnames, "templates": args.templates, "hub": args.hub, "offline": args.offline,
        "retrieval_metrics": args.retrieval_metrics,
        "batch_size": args.batch_size, "num_workers": args.num_workers, "limit": args.limit, "amp": args.amp,
        "device": args.device, "on_bad_image": args.on_bad_image, "output": args.output,
        "output_dir": args.output_dir, "cache_dir": args.cache_dir, "model_cache_dir": args.model_cache_dir,
        "skip_existing": args.skip_existing, "verbose": not args.quiet, "task_runner": args.task_runner,
        "workers": args.workers, "shard_rows": args.shard_rows,
    })
    return _run(params, args.cached_only)


def _cmd_run(args: argparse.Namespace) -> int:
    from clipcache.flows.convert_params import ConvertParams
    from clipcache.flows.evalscope import parse_task_config

    params = parse_task_config(args.config)
    if isinstance(params, ConvertParams):
        from clipcache.flows.convert import convert

        for result in convert(params):
            m = result.get("metrics", {})
            out.print(f"{result['model']} / {result['dataset']}: " + (
                "skipped (result exists)" if result.get("status") == "skipped" else
                f"{m['n_captioned']}/{m['n_images']} images captioned ({m['api_calls']} API calls, "
                f"{m['from_cache']} from cache, {m['n_failed']} failed) -> {m['save_path']}"), highlight=False)
        return 0
    return _run(params)


def _cmd_serve(args: argparse.Namespace) -> int:
    from clipcache.flows.deployments import serve_deployments

    serve_deployments(args.prefect_file, args.deployment, args.limit)
    return 0


def _run(params, cached_only: bool = False) -> int:
    from clipcache.flows.console import print_results
    from clipcache.flows.evaluate import evaluate, rescore

    results = (rescore if cached_only else evaluate)(params)
    print_results(out, results, params.output_dir)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clipcache", allow_abbrev=False,
                                     description="Evaluate CLIP-style models from an embedding cache.")
    parser.add_argument("-v", "--verbose", action="store_true", help="show Prefect and library logs")
    sub = parser.add_subparsers(dest="command", required=True)
    _eval_parser(sub, "eval")
    _eval_parser(sub, "rescore")
    run = sub.add_parser("run", help="run an evalscope-style task config (JSON or YAML)")
    run.add_argument("config", help="task_cfg.json or task_cfg.yaml")
    run.set_defaults(handler=_cmd_run)
    serve = sub.add_parser("serve", help="serve prefect.yaml's deployments (with their schedules) from this process",
                           description="Register every deployment in prefect.yaml with the Prefect API and run their "
                                       "scheduled and triggered flow runs here, until interrupted.")
    _flag(serve, "prefect_file", default="prefect.yaml")
    _flag(serve, "deployment", nargs="+", default=None, help="serve only these deployments")
    _flag(serve, "limit", type=int, default=None, help="at most this many concurrent flow runs")
    serve.set_defaults(handler=_cmd_serve)
    from clipcache.flows.cli_cache import add_cache_parser
    from clipcache.flows.cli_catalog import add_catalog_parsers
    from clipcache.flows.cli_query import add_query_parser, add_report_parser, add_results_parser

    add_cache_parser(sub)
    add_query_parser(sub)
    add_results_parser(sub)
    add_report_parser(sub)
    add_catalog_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from clipcache.flows import runtime

    runtime.configure(verbose=args.verbose)
    from clipcache.storage.errors import ClipcacheError

    try:
        return args.handler(args)
    except ClipcacheError as e:
        console.print(f"[bold red]error:[/] {_escape(str(e))}", highlight=False, soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: finished chunks are cached; run the same command again to continue")
        return 130


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


if __name__ == "__main__":
    sys.exit(main())
