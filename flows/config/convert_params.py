"""Parameters of the ``convert`` flow (captioning images into BEIR text-retrieval data)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    field_validator,
    model_validator,
)

from clipcache.storage.errors import ConfigError


class CaptionModelSpec(BaseModel):
    """A multimodal LLM behind an OpenAI-compatible API (evalscope's image_caption model entry, plus knobs)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_name: str = Field(min_length=1)
    api_base: str = Field(min_length=1, description="e.g. http://localhost:8008/v1")
    # SecretStr: Prefect's stored parameters, results and logs only ever see '**********'.
    api_key: SecretStr | None = Field(None, description="default: $OPENAI_API_KEY")
    prompt: str = Field("Describe this image in English.", min_length=1)
    max_tokens: PositiveInt = 512
    temperature: float = Field(0.0, ge=0.0)
    timeout: PositiveFloat = 60.0
    concurrency: PositiveInt = 8
    max_retries: NonNegativeInt = 5
    stall_timeout: PositiveFloat = Field(300.0, description="give the conversion up when no caption has arrived for "
                                                            "this many seconds (a hung API); what was captioned is "
                                                            "kept and the same command continues")

    @property
    def basename(self) -> str:
        return self.model_name.rstrip("/").split("/")[-1]

    @property
    def folder(self) -> str:
        """The model's output folder: evalscope's ``<model basename>`` for a plain name (``internvl2-8b``); for any
        other name the basename plus a short hash of the whole name, so ``orgA/describer`` and ``orgB/describer``
        never share a BEIR folder, and ``..`` or ``/`` never leave output_dir (storage/naming.py)."""
        from clipcache.storage.naming import path_component

        return path_component(self.basename, identity=self.model_name)

    def resolved_api_key(self, where: str = "api_key") -> str:
        if self.api_key is not None and self.api_key.get_secret_value():
            return self.api_key.get_secret_value()
        if key := os.environ.get("OPENAI_API_KEY"):
            return key
        raise ConfigError(f"{where}: no API key for {self.model_name!r} (set it in the config or OPENAI_API_KEY)")


class ConvertParams(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    models: list[CaptionModelSpec] = Field(min_length=1)
    datasets: list[str] = Field(min_length=1)
    dataset_root: str | None = None
    split: str = "test"
    limit: PositiveInt | None = None
    hub: Literal["huggingface", "modelscope"] = "huggingface"
    offline: bool = False
    output_dir: str = "outputs"
    cache_dir: str = "cache"
    skip_existing: bool = False
    verbose: bool = True

    @field_validator("split")
    @classmethod
    def _plain_split(cls, value: str) -> str:
        from clipcache.flows.config.params import plain_name

        return plain_name(value) or value

    @field_validator("output_dir", "cache_dir")
    @classmethod
    def _local(cls, value: str) -> str:
        from clipcache.flows.config.params import local_folder

        return local_folder(value)

    @model_validator(mode="after")
    def _results_outside_the_cache(self) -> ConvertParams:
        from clipcache.storage.paths import check_results_folder

        try:
            check_results_folder(self.output_dir, self.cache_dir)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return self
