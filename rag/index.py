"""FAISS indexes: build flat / IVF / HNSW on CPU, and serve on CPU, one GPU, or sharded across GPUs.

GPU use goes through faiss-gpu where it loads; without it a flat index still goes to the GPUs
through ``rag.torch_search`` (exact search in torch, fp16, sharded) when CUDA torch sees them.
With neither (or no visible GPU) the index stays on the CPU and one log line says why.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rag.manifest import IndexType, Metric

logger = logging.getLogger(__name__)

Device = Literal["auto", "cpu", "gpu"]
SearchBackend = Literal["auto", "faiss", "torch"]


def _faiss() -> Any:
    import faiss

    return faiss


def new_index(kind: IndexType, dim: int, metric: Metric = "ip", *, nlist: int = 1024, hnsw_m: int = 32) -> Any:
    """An empty CPU index of ``kind``; IVF needs ``train`` before vectors are added."""
    faiss = _faiss()
    factory = {"flat": "Flat", "ivf": f"IVF{nlist},Flat", "hnsw": f"HNSW{hnsw_m},Flat"}.get(kind)
    if factory is not None:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2)
    raise ValueError(f"unknown index type {kind!r}; choose flat, ivf or hnsw")


@dataclass
class IndexOptions:
    """Where and how to serve an index.

    Attributes:
        device: ``auto`` (GPU when faiss-gpu sees one), ``cpu`` or ``gpu``.
        gpus: GPU ids to use; None means every visible GPU.
        shard: With several GPUs, split the vectors across them (True) or replicate (False).
        fp16: Store vectors as float16 on the GPU (halves memory; wiki-18 e5 needs ~32 GB then).
        temp_memory_mb: Per-GPU scratch memory for FAISS; None keeps FAISS's default.
        nprobe: IVF lists probed per query.
        ef_search: HNSW search breadth.
        threads: OpenMP threads FAISS uses on CPU, in whichever thread searches (OpenMP's count is
            per calling thread); None keeps the default.
        search_backend: ``auto`` (faiss-gpu if it loads, else torch for a flat index on GPU),
            ``faiss`` (never torch), or ``torch`` (flat only; on ``device="cpu"`` it runs on CPU torch).
        torch_chunk_mb: Memory budget of one query chunk's score matrix per shard (torch backend).
        blas_threshold: Query batches at least this large are scored with one BLAS matrix product
            on CPU. faiss-cpu 1.15 ships 128000, which scores every batch query by query and made
            a 64-query flat search over 100k passages ~8x slower here; None keeps FAISS's value.
    """

    device: Device = "auto"
    gpus: list[int] | None = None
    shard: bool = True
    fp16: bool = True
    temp_memory_mb: int | None = None
    nprobe: int | None = None
    ef_search: int | None = None
    threads: int | None = None
    search_backend: SearchBackend = "auto"
    torch_chunk_mb: int = 1024
    blas_threshold: int | None = 20


class SearchIndex:
    """A loaded index plus where it lives; ``search`` is thread-safe for concurrent readers."""

    def __init__(self, index: Any, *, kind: str, devices: list[str], metric: Metric = "ip",
                 backend: str = "faiss", threads: int | None = None) -> None:
        self._index = index
        self.kind = kind
        self.devices = devices
        self.metric = metric
        self.backend = backend
        self.threads = threads
        self._thread_state = threading.local()

    def set_threads(self, threads: int) -> None:
        """FAISS's OpenMP threads for the searches the calling thread makes (OpenMP's count is per thread)."""
        if getattr(self._thread_state, "threads", None) != threads:
            _faiss().omp_set_num_threads(threads)
            self._thread_state.threads = threads

    @property
    def ntotal(self) -> int:
        """Vectors in the index."""
        return int(self._index.ntotal)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(scores, ids)`` per row of ``vectors``; ids are -1 where fewer exist."""
        k = max(1, min(k, self.ntotal)) if self.ntotal else 1
        if self.threads and not hasattr(self._thread_state, "threads"):
            self.set_threads(self.threads)  # a worker thread would otherwise use every core
        return self._index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)

    def describe(self) -> dict[str, Any]:
        """For ``/health``: type, metric, size and devices."""
        return {"type": self.kind, "metric": self.metric, "ntotal": self.ntotal, "devices": self.devices,
                "backend": self.backend}


def _gpu_count(faiss: Any) -> tuple[int, str | None]:
    """Visible GPUs, or 0 and the reason there are none."""
    if not hasattr(faiss, "StandardGpuResources"):
        return 0, "this faiss build has no GPU support (install faiss-gpu to use GPUs)"
    n = int(faiss.get_num_gpus())
    return (n, None) if n else (0, "faiss-gpu sees no GPU")


def _torch_devices(kind: str, opts: IndexOptions) -> tuple[list[str], str | None]:
    """Devices for the torch flat search, or none and why."""
    if kind != "flat":
        return [], f"the torch search is exact flat search only, and this index is {kind}"
    if opts.device == "cpu":
        return (["cpu"], None) if opts.search_backend == "torch" else ([], "device is cpu")
    try:
        import torch
    except ImportError:
        return [], "torch is not installed"
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        return [], "torch sees no CUDA device"
    gpus = opts.gpus if opts.gpus is not None else list(range(n))
    bad = [g for g in gpus if not 0 <= g < n]
    if bad:
        raise ValueError(f"GPU ids {bad} are not visible (torch sees {n})")
    return [f"cuda:{g}" for g in gpus], None


def _to_gpu(faiss: Any, cpu_index: Any, kind: str, opts: IndexOptions, ngpu: int) -> tuple[Any, list[str]]:
    gpus = opts.gpus if opts.gpus is not None else list(range(ngpu))
    bad = [g for g in gpus if not 0 <= g < ngpu]
    if bad:
        raise ValueError(f"GPU ids {bad} are not visible (faiss sees {ngpu})")
    resources = []
    for _ in gpus:
        res = faiss.StandardGpuResources()
        if opts.temp_memory_mb is not None:
            res.setTempMemory(int(opts.temp_memory_mb) << 20)
        resources.append(res)
    if len(gpus) == 1:
        co = faiss.GpuClonerOptions()
        co.useFloat16 = opts.fp16
        index = faiss.index_cpu_to_gpu(resources[0], gpus[0], cpu_index, co)
        devices = [f"cuda:{gpus[0]}"]
    else:
        co = faiss.GpuMultipleClonerOptions()
        co.shard = opts.shard
        co.useFloat16 = opts.fp16
        index = faiss.index_cpu_to_gpu_multiple_py(resources, cpu_index, co, gpus)
        devices = [f"cuda:{g}" for g in gpus]
    index.__dict__["_gpu_resources"] = resources  # the resources must outlive the index
    mode = "sharded" if len(gpus) > 1 and opts.shard else "replicated" if len(gpus) > 1 else "single"
    logger.info("%s index on %s (%s, fp16=%s)", kind, ", ".join(devices), mode, opts.fp16)
    return index, devices


def load_index(path: str | Path, kind: str = "flat", metric: Metric = "ip", options: IndexOptions | None = None,
               *, mmap: bool = False) -> SearchIndex:
    """Read an index file and place it per ``options`` (GPU if asked and possible, else CPU).

    ``mmap`` memory-maps the vectors instead of reading them into the heap (CPU serving of indexes
    larger than RAM; the OS page cache holds what is hot).
    """
    faiss = _faiss()
    opts = options or IndexOptions()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"index file not found: {path}")
    flags = 0
    if mmap:  # flat codes map straight from the file (page cache, not heap); IVF maps its inverted lists
        flags = faiss.IO_FLAG_MMAP_IFC if kind == "flat" else faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY
    cpu_index = faiss.read_index(str(path), flags)
    if opts.blas_threshold is not None:
        faiss.cvar.distance_compute_blas_threshold = opts.blas_threshold
    if opts.nprobe is not None and hasattr(cpu_index, "nprobe"):
        cpu_index.nprobe = opts.nprobe
    if opts.ef_search is not None and hasattr(cpu_index, "hnsw"):
        cpu_index.hnsw.efSearch = opts.ef_search
    if opts.search_backend == "torch" or (opts.search_backend == "auto" and opts.device != "cpu"):
        torch_devices, why_not_torch = _torch_devices(kind, opts)
        if torch_devices and (opts.search_backend == "torch" or _gpu_count(faiss)[0] == 0):
            from rag.torch_search import from_faiss

            index = from_faiss(cpu_index, metric, torch_devices, fp16=opts.fp16, chunk_mb=opts.torch_chunk_mb)
            return SearchIndex(index, kind=kind, devices=torch_devices, metric=metric, backend="torch",
                               threads=opts.threads)
        if opts.search_backend == "torch":
            raise ValueError(f"search_backend='torch' cannot serve this index: {why_not_torch}")
    if opts.device != "cpu":
        ngpu, why_not = _gpu_count(faiss)
        if ngpu and kind == "hnsw":
            why_not = "FAISS has no GPU HNSW"
        if ngpu and why_not is None:
            index, devices = _to_gpu(faiss, cpu_index, kind, opts, ngpu)
            if opts.nprobe is not None:
                faiss.GpuParameterSpace().set_index_parameter(index, "nprobe", opts.nprobe)
            return SearchIndex(index, kind=kind, devices=devices, metric=metric, threads=opts.threads)
        if opts.device == "gpu":
            logger.warning("GPU requested but %s; serving the %s index on CPU", why_not, kind)
        else:
            logger.info("serving the %s index on CPU: %s", kind, why_not)
    return SearchIndex(cpu_index, kind=kind, devices=["cpu"], metric=metric, threads=opts.threads)
