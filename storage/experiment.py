"""What identifies a result: one typed definition, used by the result file path, the warehouse grain,
``--skip_existing``, dbt's uniqueness tests and the report (the cache key is built from the same pieces).

An experiment is a model and its checkpoint (a pretrained tag, the content hash of a weights file or model folder, a
hub revision), evaluated on a dataset split in a language for a task, with prompts (class names and templates, by
content hash), a sample limit, a precision and the task settings that change numbers. Two runs of one experiment are
repetitions: the latest completed one is its current value. A limited run, other prompts or other task settings make
another experiment, which never replaces the reference one (full data, the dataset's own prompts, default settings)
on a leaderboard.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from clipcache.storage.hashing import canonical_json, digest
from clipcache.storage.naming import bounded, path_component
from clipcache.storage.paths import AnyPath, as_path

# The fields that identify an experiment; `pretrained` (a readable label) and `default_prompts` (derived) are not.
IDENTITY_FIELDS = ("model", "checkpoint", "dataset", "split", "language", "task", "precision", "sample_limit",
                   "prompts", "options")
# The unit of the one sample row that links an experiment to the per-sample metadata it was scored with
# (storage/sample_metadata.py; the tasks declare it as tasks/evaluation/common.py's METADATA_LINK). Here, not there:
# the tasks' declarations are read without importing pyarrow.
LINK_UNIT = "metadata"
# The option an mteb task's experiment of a model with query and document roles carries (tasks/identity.py:
# roles_option): its queries went to the model as queries. Not a what-if: such an experiment is still the reference.
MTEB_ROLES = {"mteb_roles": "query-document"}
_UNSAFE = re.compile(r"[^\w.@+=-]+")


def slug(text: str) -> str:
    """A file-name-safe form: ``wds/cifar10`` -> ``wds_cifar10``."""
    return _UNSAFE.sub("_", text).strip("_") or "_"


@dataclass(frozen=True)
class Experiment:
    model: str  # as the user names it (an architecture, hub id, bundled name); local folders by their name
    checkpoint: str  # identity of the weights: "tag:<tag>", "sha256:<hex>", "hub:<id>@<revision>", "random-init:<seed>"
    dataset: str
    split: str
    language: str
    task: str
    precision: str = "fp32"
    sample_limit: int | None = None
    prompts: str | None = None  # SHA-256 of the class names + templates used (tasks that use prompts)
    default_prompts: bool = True  # the dataset's own class names and templates for this language
    options: str = "{}"  # canonical JSON of the task settings that differ from their defaults
    pretrained: str | None = None  # readable checkpoint label: the tag, or "<file name>@<hash prefix>"
    model_dir: str = ""  # the result folder: the last path component of the model name (evalscope's layout)

    @property
    def id(self) -> str:
        return digest({name: getattr(self, name) for name in IDENTITY_FIELDS})[:16]

    @property
    def option_values(self) -> dict[str, Any]:
        return dict(json.loads(self.options))

    @property
    def is_reference(self) -> bool:
        """Full data, the dataset's own prompts, default task settings (MTEB_ROLES aside): what a leaderboard shows."""
        return self.sample_limit is None and self.default_prompts and self.options in REFERENCE_OPTIONS

    def qualifiers(self) -> list[str]:
        """What sets this experiment apart from the reference one of the same model, dataset and task."""
        out = []
        if self.language != "en":
            out.append(path_component(self.language))
        if self.precision != "fp32":
            out.append(self.precision)
        if self.sample_limit is not None:
            out.append(f"limit{self.sample_limit}")
        if not self.default_prompts and self.prompts:
            out.append(f"prompts-{self.prompts[:8]}")
        options = self.option_values
        if options:
            text = "_".join(f"{k}-{v}" for k, v in sorted(options.items()))
            out.append(text if len(text) <= 40 and path_component(text) == text else f"options-{digest(options)[:8]}")
        return out

    def result_path(self, output_dir: str | AnyPath) -> AnyPath:
        """``<output_dir>/<model>/[<pretrained>/]<dataset>_<task>[.<qualifier>...].json``: evalscope's layout for the
        reference experiment of a model without a pretrained tag, and a path of its own for every other. Each part
        is one path component (storage/naming.py): a name that is not already a safe file name (``wds/cifar10``,
        ``..``, a NUL) gets a short hash of itself, so the path never leaves ``output_dir`` and two names never share
        it. Names that share only a last path component (``orgA/clip``, ``orgB/clip``: evalscope's model folder)
        are told apart when the file is written (tasks/results.py: ``result_file_for``)."""
        folder = as_path(output_dir) / path_component(self.model_dir or self.model)
        if self.pretrained:
            folder = folder / path_component(self.pretrained)
        name = ".".join([f"{path_component(self.dataset)}_{self.task}", *self.qualifiers()])
        return folder / f"{bounded(name)}.json"

    def alternate_result_path(self, output_dir: str | AnyPath) -> AnyPath:
        """Where this experiment's result goes when :meth:`result_path` already holds another experiment's."""
        path = self.result_path(output_dir)
        return path.with_name(f"{path.name.removesuffix('.json')}.{self.id[:8]}.json")

    def columns(self) -> dict[str, Any]:
        """The experiment's columns in a warehouse row."""
        return {"experiment_id": self.id, "model": self.model, "pretrained": self.pretrained,
                "checkpoint": self.checkpoint, "dataset": self.dataset, "split": self.split, "language": self.language,
                "task": self.task, "precision": self.precision, "sample_limit": self.sample_limit,
                "prompts_sha256": self.prompts, "default_prompts": self.default_prompts,
                "task_options": self.options}

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, **asdict(self)}


def options_json(options: dict[str, Any]) -> str:
    return canonical_json(options)


# The options of a reference experiment: none, or only MTEB_ROLES (dbt_reports/models/marts/latest_metrics.sql
# spells the same two)
REFERENCE_OPTIONS = ("{}", options_json(MTEB_ROLES))
