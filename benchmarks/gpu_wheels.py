"""What benchmarks/gpu_checks.sh needs on a lent GPU machine beyond that machine's own image (which has torch,
torchvision, transformers, timm, numpy 2.5, pandas, pyarrow, scikit-learn, pytest, ... but not Prefect, dbt, DuckDB,
Zarr, open_clip or clip_benchmark), as cp312 manylinux wheels, packed to fit a device call (64 MiB with the working
tree, about 11 MiB of it).

    .venv/bin/python benchmarks/gpu_wheels.py --set bench            # downloads into .whl-bench/
    .venv/bin/python benchmarks/gpu_wheels.py --set bench --pack     # .whl-bench/site.tar.xz; then rm .whl-bench/*.whl
    (the same with --set cli: .whl-cli/)

Everything the checks import is about 200 MiB of wheels, more than one call carries, so there are two sets, one per
device call:

- ``bench`` (the steps tests, decode, amp, amp_parity, sweep): Zarr, open_clip, pydantic, webdataset, LAION
  clip_benchmark, and numpy < 2.4 (the image's 2.5 breaks clip_benchmark's accuracy code);
- ``cli`` (the step cli): the same minus numpy and clip_benchmark, plus Prefect (with its server), dbt-core, dbt-duckdb
  and DuckDB.

A set is the dependency closure, read from this virtual environment's installed metadata, of its roots, at the
versions installed here, minus what the image holds (``IMAGE``, read off such a machine on 2026-11-17) and torch's
own CUDA packages. A package with no wheel on the index for that platform is built here (pure Python only).

``--pack`` unpacks a set's wheels into one archive, leaving out what the checks never read (pycocoevalcap's Java jars
and data: clip_benchmark imports its Python modules for captioning only; babel's locale data but English;
clip_benchmark's CuPL and Babel-ImageNet prompt files; Prefect's UI (the checks run its server without it); packages'
``tests`` folders, type stubs and scripts), and writes ``site.tar.xz`` (LZMA through Python's own ``tarfile``: the GPU
machine may have no ``xz``), which benchmarks/gpu_checks.sh unpacks into /tmp/site. Then delete the ``*.whl`` files:
the call carries the whole folder.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
COMMON = ["zarr", "numcodecs", "google-crc32c", "open_clip_torch", "pydantic", "pyyaml", "rich", "filelock", "fsspec",
          "webdataset"]
SETS = {"bench": [*COMMON, "clip-benchmark", "numpy"],
        "cli": [*COMMON, "prefect", "dbt-core", "dbt-duckdb", "duckdb", "fastapi", "sqlalchemy"]}
CARRY_ANYWAY = {"bench": {"numpy"}, "cli": set()}  # the cli set runs on the image's numpy 2.5
NEVER = {"apprise", "docker"}  # imported by Prefect only when a notification block or a Docker image is used
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp""".split())
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64"]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(kind: str) -> dict[str, str]:
    """name -> installed version, for the set's roots and everything they require (markers as on Linux, Python
    3.12)."""
    env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    seen: dict[str, str] = {}
    todo = list(SETS[kind])
    while todo:
        name = norm(todo.pop())
        if name in seen or name in NEVER:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            print(f"  (not installed here, skipped: {name})")
            continue
        seen[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                todo.append(req.name)
    return {n: v for n, v in seen.items()
            if (n not in IMAGE or n in CARRY_ANYWAY[kind]) and not n.startswith(("nvidia-", "cuda-", "torch", "triton"))}


def keep(path: str) -> bool:
    """Whether a file of the unpacked wheels goes into the pack (see --pack)."""
    parts = path.split("/")
    if parts[0] == "pycocoevalcap":
        return path.endswith(".py")
    if parts[0] == "babel" and len(parts) > 2 and parts[1] == "locale-data":
        return parts[2].split(".")[0].split("_")[0] in ("root", "en")
    if parts[0] == "clip_benchmark" and parts[-1] in ("cupl_prompts.json", "babel_imagenet.json"):
        return False  # read only for --custom_template_file cupl_prompts.json and the babel_imagenet dataset
    if parts[0] == "prefect" and len(parts) > 2 and parts[1] == "server" and parts[2].startswith("ui"):
        return False  # the UI's static files: gpu_checks.sh runs Prefect's server with PREFECT_UI_ENABLED=false
    if "tests" in parts[1:-1] or (parts[0].endswith(".data") and len(parts) > 1 and parts[1] == "scripts"):
        return False
    return not path.endswith(".pyi")


def pack(dest: Path, preset: int) -> None:
    import tarfile
    import zipfile

    target = dest / "site.tar.xz"
    kept = total = 0
    with tarfile.open(target, "w:xz", preset=preset) as tar:
        for wheel in sorted(dest.glob("*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                for info in archive.infolist():
                    total += info.file_size
                    name = info.filename
                    if info.is_dir() or not keep(name):
                        continue
                    if ".data/" in name.split("/", 1)[0] + "/":  # <dist>.data/{purelib,platlib}/x -> x
                        _, kind, *rest = name.split("/")
                        if kind not in ("purelib", "platlib") or not rest:
                            continue
                        name = "/".join(rest)
                    member = tarfile.TarInfo(name)
                    member.size, member.mode = info.file_size, 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
                    with archive.open(info) as data:
                        tar.addfile(member, data)
                    kept += info.file_size
    print(f"{target}: {target.stat().st_size / 2**20:.1f} MiB ({kept / 2**20:.0f} of {total / 2**20:.0f} MiB "
          f"unpacked kept)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), required=True, help="bench or cli (one device call each)")
    parser.add_argument("--dest", help="default: .whl-<set> in the repository")
    parser.add_argument("--preset", type=int, default=6, help="LZMA preset of --pack (9: slower, a little smaller)")
    parser.add_argument("--dry_run", action="store_true", help="list what would be downloaded")
    parser.add_argument("--pack", action="store_true", help="pack the downloaded wheels into site.tar.xz")
    args = parser.parse_args()
    dest = Path(args.dest or REPO / f".whl-{args.set}")
    if args.pack:
        pack(dest, args.preset)
        return
    wanted = closure(args.set)
    print(f"{len(wanted)} packages: " + " ".join(f"{n}=={v}" for n, v in sorted(wanted.items())))
    if args.dry_run:
        return
    dest.mkdir(exist_ok=True)
    for name, version in sorted(wanted.items()):
        platform = [a for p in PLATFORMS for a in ("--platform", p)]
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "--python-version", "3.12", "--implementation", "cp", *platform, "-d", str(dest),
                              f"{name}=={version}"], capture_output=True, text=True)
        if got.returncode:  # no wheel on the index: build one here (pure Python packages only)
            built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest),
                                    f"{name}=={version}"], capture_output=True, text=True)
            if built.returncode:
                raise SystemExit(f"no wheel for {name}=={version}:\n{got.stderr[-800:]}\n{built.stderr[-800:]}")
            print(f"  built {name}=={version} here (no wheel on the index)")
    size = sum(p.stat().st_size for p in dest.glob("*.whl"))
    print(f"{len(list(dest.glob('*.whl')))} wheels in {dest}: {size / 2**20:.1f} MiB (a device call carries 64 MiB "
          f"with the working tree)")


if __name__ == "__main__":
    main()
