"""What every evalscope tool's config shares (flows/config/evalscope.py: clip_benchmark; flows/config/evalscope_mteb.py: mteb)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from clipcache.storage.errors import ConfigError


def tool_name(value: Any) -> Any:
    """``eval_config.tool`` as evalscope compares it."""
    return value.lower() if isinstance(value, str) else value  # evalscope accepts "MTEB", "CLIP_Benchmark"...


class WorkDir(BaseModel):
    """evalscope's top-level ``work_dir`` and ``no_timestamp`` (TaskConfig), shared by every tool's config."""

    model_config = ConfigDict(extra="forbid")

    eval_backend: Literal["RAGEval"] = "RAGEval"
    work_dir: str | None = None
    no_timestamp: bool = False  # without work_dir it changes nothing: the eval section's folder has no timestamp

    def output_dir(self, eval_output: str, given: bool, key: str) -> str:
        """Where results go: ``<work_dir>/<timestamp>`` as evalscope writes them, or the eval section's folder when
        there is no work_dir. evalscope ignores that folder when both are set; here that is an error naming both."""
        if self.work_dir is None:
            return eval_output
        if given:
            raise ConfigError(f"invalid configuration: eval_config.eval.{key} ({eval_output!r}) and work_dir "
                              f"({self.work_dir!r}) both say where results go; evalscope would use work_dir: "
                              f"keep one")
        if self.no_timestamp:
            return self.work_dir
        return f"{self.work_dir.rstrip('/')}/{datetime.now().strftime('%Y%m%d_%H%M%S')}"  # evalscope's format
