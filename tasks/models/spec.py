"""The validated description of a model to evaluate (shared by the CLI, evalscope configs and flow parameters)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from clipcache.tasks.models.api_spec import ApiFields

Hub = Literal["huggingface", "modelscope", "local"]


class ModelSpec(ApiFields):  # ApiFields: the api_* settings of api: models (unset for every other model)
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model_name: str = Field(min_length=1, description="open_clip architecture, local-dir:/hf-hub: name, HF/ModelScope id "
                                                      "or local directory, or a bundled model (tiny-shapes-clip)")
    pretrained: str | None = Field(None, description="open_clip pretrained tag or checkpoint file; unset = random "
                                                     "weights (seeded) for a bare architecture name")
    model_type: str = Field("auto", description="auto, or a registered model loader (clipcache models --types): "
                                                "open_clip, hf, modelscope, sentence_transformers, or a plugin's")
    arch_config: str | None = Field(None, description="extra open_clip architecture JSON file or directory to register")
    revision: str | None = Field(None, description="hub revision (branch, tag or commit) for hub ids")
    hub: Hub = Field("huggingface", description="where an 'org/name' id is fetched from when model_type is auto "
                                                "(local: model_name is a folder, evalscope's HubType.LOCAL)")
    trust_remote_code: bool = Field(False, description="run the Python code this model's own folder (local, "
                                                       "or its hub repository's snapshot) supplies (--model_type "
                                                       "internvl): recorded in its identity with a hash of every "
                                                       "code file; never for another model")

    @field_validator("model_name", "pretrained", "revision")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        # names become folder names, cache-key text and log lines
        if value is not None and any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ValueError(f"{value!r} holds a control character (NUL, newline, ...)")
        return value

    @field_validator("model_type")
    @classmethod
    def _registered(cls, value: str) -> str:
        from clipcache.tasks.models import LOADERS

        if value != "auto" and value not in LOADERS:
            raise ValueError(f"unknown model type {value!r} (known: auto, {', '.join(LOADERS.names())})"
                             f"{LOADERS.suggest(value)}")
        return value

    @property
    def bare_name(self) -> str:
        """The name without a ``local-dir:`` / ``hf-hub:`` prefix."""
        for prefix in ("local-dir:", "hf-hub:"):
            if self.model_name.startswith(prefix):
                return self.model_name[len(prefix):]
        return self.model_name

    @property
    def basename(self) -> str:
        """Last path component of the model name: ``local-dir:/m/pat`` -> ``pat`` (evalscope's result folder)."""
        name = self.bare_name
        return name.rstrip("/").split("/")[-1] or name

    @property
    def is_local(self) -> bool:
        return self.model_name.startswith("local-dir:") or (self.model_name.startswith(("/", ".", "~"))
                                                            or Path(self.model_name).expanduser().is_dir())

    @property
    def display_name(self) -> str:
        """How results name the model: as given, except that a local folder is named by its folder name (it is
        identified by its content, so moving it changes nothing)."""
        return self.basename if self.is_local else self.model_name
