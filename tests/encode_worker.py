"""Encode N generated shapes images with the bundled model into a cache (run as a subprocess by the fault tests).

    python tests/encode_worker.py CACHE_DIR N BATCH_SIZE  -> prints "<key> <resumed> <encoded>"
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch

    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.datasets.shapes import load_shapes
    from clipcache.tasks.encode.stage import ModelSession, encode_images, image_key_fields
    from clipcache.tasks.evaluation.base import EncodeSettings
    from clipcache.tasks.models.resolve import resolve_model
    from clipcache.tasks.models.spec import ModelSpec
    from clipcache.tasks.progress import StageProgress

    cache, n, batch_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           False, "fp32")
    ds = load_shapes("shapes", "zeroshot_classification", "test", None, size=n)
    out = encode_images(session, ds, EmbeddingStore(cache), image_key_fields(session, ds.identity(memo), "test", None),
                        EncodeSettings(batch_size, 1, "error"), StageProgress(enabled=False))
    print(out.ref.key, out.resumed, out.encoded, flush=True)


if __name__ == "__main__":
    main()
