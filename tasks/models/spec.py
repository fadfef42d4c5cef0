"""The validated description of a model to evaluate (shared by the CLI, evalscope configs and flow parameters)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ModelType = Literal["auto", "open_clip", "hf", "modelscope", "sentence_transformers"]


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model_name: str = Field(min_length=1, description="open_clip architecture, local-dir:/hf-hub: name, HF/ModelScope id "
                                                      "or local directory, or a bundled model (tiny-shapes-clip)")
    pretrained: str | None = Field(None, description="open_clip pretrained tag or checkpoint file; unset = random "
                                                     "weights (seeded) for a bare architecture name")
    model_type: ModelType = "auto"
    arch_config: str | None = Field(None, description="extra open_clip architecture JSON file or directory to register")
    revision: str | None = Field(None, description="hub revision (branch, tag or commit) for hub ids")
    hub: Literal["huggingface", "modelscope"] = Field(
        "huggingface", description="where an 'org/name' id is fetched from when model_type is auto")

    @property
    def basename(self) -> str:
        """Last path component of the model name: ``local-dir:/m/pat`` -> ``pat`` (evalscope's result folder)."""
        name = self.model_name.split(":", 1)[1] if self.model_name.startswith(("local-dir:", "hf-hub:")) else \
            self.model_name
        return name.rstrip("/").split("/")[-1] or name
