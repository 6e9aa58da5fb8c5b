"""Throughput of `nandoctor.datacheck` on large .npy files against a plain numpy loop.

    python bench/bench_check_data.py [--files 4] [--size-mb 256] [--rounds 3] [--workers 0]

Writes FILES float32 .npy files of SIZE-MB each into a temporary folder (deleted at the
end), then alternates, ROUNDS times: the numpy baseline
`np.isfinite(np.load(f, mmap_mode="r")).all()` over every file, and `scan()` over the
folder. Both read the same files from the page cache after a warm-up read, so the figures
compare the checking, not the disk. Prints GB/s per round and the best of each.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nandoctor.datacheck import CheckOptions, scan  # noqa: E402


def write_files(folder: str, files: int, size_mb: int) -> list[str]:
    """Written with plain write() in pieces (bounded memory) and fsync'd, so that no
    write-back of dirty pages runs while the contenders are timed."""
    rng = np.random.default_rng(0)
    elements = size_mb * (1 << 20) // 4
    paths = []
    for i in range(files):
        path = os.path.join(folder, f"part{i:02d}.npy")
        with open(path, "wb") as out:
            header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                      "fortran_order": False, "shape": (elements,)}
            np.lib.format.write_array_header_1_0(out, header)
            for start in range(0, elements, 1 << 24):
                rng.standard_normal(min(1 << 24, elements - start), dtype=np.float32).tofile(out)
            out.flush()
            os.fsync(out.fileno())
        paths.append(path)
    return paths


def numpy_baseline(paths: list[str]) -> bool:
    return all(bool(np.isfinite(np.load(p, mmap_mode="r")).all()) for p in paths)


def nandoctor_scan(folder: str, workers: int, chunk_bytes: int | None) -> bool:
    options = CheckOptions() if chunk_bytes is None else CheckOptions(chunk_bytes=chunk_bytes)
    report = scan([folder], errors=["nan", "inf"], options=options, workers=workers, progress=False)
    return not report.problems


def timed(fn, *args) -> tuple[float, bool]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="0: one per core (nandoctor's default)")
    parser.add_argument("--chunk-kb", type=int, default=None, help="override the chunk size")
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    args = parser.parse_args()

    chunk = args.chunk_kb * 1024 if args.chunk_kb else None
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        paths = write_files(folder, args.files, args.size_mb)
        total_gb = sum(os.path.getsize(p) for p in paths) / 1e9
        numpy_baseline(paths)  # warm the page cache for both contenders
        rows = []
        for round_ in range(1, args.rounds + 1):
            t_np, ok_np = timed(numpy_baseline, paths)
            t_nd, ok_nd = timed(nandoctor_scan, folder, args.workers, chunk)
            assert ok_np and ok_nd, "the generated data should be clean"
            rows.append((round_, total_gb / t_np, total_gb / t_nd))
        print_table(rows, total_gb, args)


def print_table(rows, total_gb: float, args) -> None:
    print(f"{args.files} x {args.size_mb} MB float32 .npy ({total_gb:.2f} GB), workers={args.workers or 'auto'}, "
          f"cores={os.cpu_count()}")
    print(f"{'round':>5}  {'numpy GB/s':>10}  {'nandoctor GB/s':>14}  {'ratio':>6}")
    for round_, np_rate, nd_rate in rows:
        print(f"{round_:>5}  {np_rate:>10.2f}  {nd_rate:>14.2f}  {nd_rate / np_rate:>6.2f}")
    best_np = max(r[1] for r in rows)
    best_nd = max(r[2] for r in rows)
    print(f"{'best':>5}  {best_np:>10.2f}  {best_nd:>14.2f}  {best_nd / best_np:>6.2f}")


if __name__ == "__main__":
    main()
