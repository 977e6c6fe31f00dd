"""The torch flat search (the GPU path without faiss-gpu), run on CPU torch: same ids and scores as FAISS flat."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")
torch = pytest.importorskip("torch")

from rag.errors import TorchSearchError  # noqa: E402
from rag.index import IndexOptions, load_index, new_index  # noqa: E402
from rag.torch_search import TorchFlatIndex, from_faiss  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _data(n: int = 3000, d: int = 48, q: int = 37, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xb = rng.standard_normal((n, d)).astype(np.float32)
    xq = rng.standard_normal((q, d)).astype(np.float32)
    return xb, xq


def _faiss_flat(xb: np.ndarray, metric: str) -> object:
    index = new_index("flat", xb.shape[1], metric)
    index.add(xb)
    return index


@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize("shards", [1, 3])
def test_fp32_matches_faiss_flat_ids_and_scores(metric: str, shards: int) -> None:
    xb, xq = _data()
    want_s, want_i = _faiss_flat(xb, metric).search(xq, 10)
    # A tiny chunk budget cuts the 37 queries into several chunks; 3 CPU "devices" exercise the shard merge.
    index = TorchFlatIndex(xb, metric=metric, devices=["cpu"] * shards, fp16=False, chunk_mb=0)
    got_s, got_i = index.search(xq, 10)
    assert got_i.dtype == np.int64 and got_s.dtype == np.float32
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-4, atol=1e-3)


def test_fp16_storage_keeps_the_ranking() -> None:
    xb, xq = _data(d=64)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    xq /= np.linalg.norm(xq, axis=1, keepdims=True)
    want_s, want_i = _faiss_flat(xb, "ip").search(xq, 5)
    got_s, got_i = TorchFlatIndex(xb, metric="ip", devices=["cpu", "cpu"], fp16=True).search(xq, 5)
    # fp16 rounding (~1e-3) may swap near-ties, nothing more.
    assert (got_i[:, 0] == want_i[:, 0]).mean() >= 0.9
    np.testing.assert_allclose(got_s, want_s, atol=5e-3)


def test_k_past_the_index_size_pads_with_minus_one() -> None:
    xb, xq = _data(n=4, q=2)
    scores, ids = TorchFlatIndex(xb, fp16=False).search(xq, 6)
    assert (ids[:, 4:] == -1).all() and sorted(ids[0, :4].tolist()) == [0, 1, 2, 3]


def test_bad_shapes_are_typed_errors() -> None:
    xb, _ = _data(n=10)
    index = TorchFlatIndex(xb, fp16=False)
    with pytest.raises(TorchSearchError):
        index.search(np.zeros((2, 5), dtype=np.float32), 3)
    with pytest.raises(TorchSearchError):
        TorchFlatIndex(xb, metric="cosine")


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_load_index_serves_a_faiss_file_through_torch(tmp_path: Path, metric: str) -> None:
    xb, xq = _data()
    flat = _faiss_flat(xb, metric)
    path = tmp_path / "index.faiss"
    faiss.write_index(flat, str(path))
    served = load_index(path, "flat", metric, IndexOptions(device="cpu", search_backend="torch", fp16=False))
    assert served.describe()["backend"] == "torch" and served.devices == ["cpu"]
    want_s, want_i = flat.search(xq, 5)
    got_s, got_i = served.search(xq, 5)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-4, atol=1e-3)
    same = from_faiss(flat, metric, ["cpu"], fp16=False).search(xq, 5)
    np.testing.assert_array_equal(same[1], want_i)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_gpu_fp16_sharded_matches_faiss_top1() -> None:
    xb, xq = _data(n=20000, d=128, q=300)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    want_s, want_i = _faiss_flat(xb, "ip").search(xq, 10)
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] * 2
    got_s, got_i = TorchFlatIndex(xb, devices=devices, fp16=True, chunk_mb=1).search(xq, 10)
    assert (got_i[:, 0] == want_i[:, 0]).mean() > 0.99
    np.testing.assert_allclose(got_s, want_s, atol=5e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_gpu_fp32_matches_faiss_flat_ids_and_scores(metric: str) -> None:
    xb, xq = _data(n=20000, d=96, q=300)
    want_s, want_i = _faiss_flat(xb, metric).search(xq, 11)  # the 11th only to see near-ties at rank 10
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] * 2  # two shards per GPU: the merge runs
    got_s, got_i = TorchFlatIndex(xb, metric=metric, devices=devices, fp16=False, chunk_mb=1).search(xq, 10)
    # cuBLAS sums in another order than FAISS's CPU BLAS (~1e-5 apart): ids may differ only between near-ties.
    gaps = np.abs(np.diff(want_s, axis=1))
    near_tie = np.zeros(want_s.shape, dtype=bool)
    near_tie[:, 1:] |= gaps < 1e-3
    near_tie[:, :-1] |= gaps < 1e-3
    want_s, want_i, near_tie = want_s[:, :10], want_i[:, :10], near_tie[:, :10]
    np.testing.assert_allclose(got_s, want_s, rtol=1e-4, atol=1e-3)
    assert ((got_i == want_i) | near_tie).all()
    assert (got_i == want_i).mean() > 0.99
