"""segment_sum benchmark: our op in process against tf.sparse.segment_sum and
torch.segment_reduce(reduce="sum") on the same data, in the same run.

10,000,000 rows of width 16 (float32) reduced into 1,000,000 segments: segment ids sorted
(random segment sizes, a few segments empty), num_segments given, int64 indices and ids.
Two index patterns: ``indices = arange`` (rows read in order) and a random permutation (each
row read from a random place). torch.segment_reduce takes no indices: it is given
``data.index_select(0, indices)`` (timed with it; skipped for arange) and the segment lengths
(computed outside the timing). Every library runs on the same number of threads (2 by
default). Best of ``--repeat`` runs, interleaved; ratios are peer time / our time (above 1: sparseserve is
faster). A numpy copy of the bytes the op must move at least once gives the memory-bandwidth
floor in the same run. Peers are optional: a missing one is reported and skipped.

``python -m bench.segment --scale 0.1`` for a quicker run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform

import numpy as np

from ._results import figure, record
from ._timing import best_of_each


def make_data(rows: int, width: int, segments: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((rows, width), dtype=np.float32)
    ids = np.sort(rng.integers(0, segments, rows, dtype=np.int64))
    perm = rng.permutation(rows).astype(np.int64)
    return data, ids, perm


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.segment")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the issue's sizes")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="threads for every library")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    threads = args.threads

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numba

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    from sparseserve.server.ops import REGISTRY

    rows, segments = int(10_000_000 * args.scale), int(1_000_000 * args.scale)
    data, ids, perm = make_data(rows, args.width, segments)
    arange = np.arange(rows, dtype=np.int64)
    op = REGISTRY.get("segment_sum")

    try:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        tf_data, tf_ids = tf.constant(data), tf.constant(ids)
    except ImportError:
        tf = None
        print("tensorflow not installed: skipping the TensorFlow peer")
    try:
        import torch

        torch.set_num_threads(threads)
        t_data = torch.from_numpy(data)
        t_lengths = torch.from_numpy(np.bincount(ids, minlength=segments))
    except ImportError:
        torch = None
        print("torch not installed: skipping the torch peer")

    # The least the op must move: read data, indices and ids, write the output. A numpy copy of
    # that many bytes (which reads and writes each once) runs among the contenders.
    moved = data.nbytes + arange.nbytes + ids.nbytes + segments * args.width * 4
    big, copy_to = np.ones(moved // 8), np.ones(moved // 8)  # into touched memory: no page faults

    results = []
    for pattern, indices in (("indices = arange", arange), ("indices = random permutation", perm)):
        bound = op.bind({"data": data, "indices": indices, "segment_ids": ids, "num_segments": segments})
        ours_out = op.run("cpu", bound)[0]
        fns = {"ours": lambda bound=bound: op.run("cpu", bound), "copy": lambda: np.copyto(copy_to, big)}
        if tf is not None:
            tf_idx = tf.constant(indices)
            want = tf.sparse.segment_sum(tf_data, tf_idx, tf_ids, num_segments=segments).numpy()
            np.testing.assert_allclose(ours_out, want, rtol=1e-4, atol=1e-4)
            fns["tf"] = lambda tf_idx=tf_idx: tf.sparse.segment_sum(tf_data, tf_idx, tf_ids,
                                                                    num_segments=segments).numpy()
        if torch is not None:
            t_idx = torch.from_numpy(indices)
            if indices is arange:
                fns["torch"] = lambda: torch.segment_reduce(t_data, "sum", lengths=t_lengths, axis=0,
                                                            unsafe=True)
            else:
                fns["torch"] = lambda t_idx=t_idx: torch.segment_reduce(t_data.index_select(0, t_idx), "sum",
                                                                        lengths=t_lengths, axis=0, unsafe=True)
            np.testing.assert_allclose(ours_out, fns["torch"]().numpy(), rtol=1e-4, atol=1e-4)
        row = {"pattern": pattern, **best_of_each(fns, args.repeat)}
        results.append(row)
        del bound

    print(f"\n{datetime.date.today()} on {platform.machine()} with {os.cpu_count()} cores, "
          f"{platform.python_implementation()} {platform.python_version()}; segment_sum of {rows:,} x "
          f"{args.width} float32 rows into {segments:,} sorted segments, int64 indices and ids, "
          f"{threads} threads each, best of {args.repeat}\n")
    print("| indices | sparseserve (s) | tf.sparse.segment_sum (s) | tf / ours | "
          "torch.segment_reduce (s) | torch / ours |")
    print("|---|---|---|---|---|---|")
    for r in results:
        tf_s = f"{r['tf']:.4f} | {r['tf'] / r['ours']:.2f}x" if "tf" in r else "- | -"
        torch_s = f"{r['torch']:.4f} | {r['torch'] / r['ours']:.2f}x" if "torch" in r else "- | -"
        print(f"| {r['pattern']} | {r['ours']:.4f} | {tf_s} | {torch_s} |")
    print("\n(torch is given the segment lengths precomputed; with the permutation its time includes "
          "data.index_select(0, indices).)")
    print("\nMemory bandwidth: a numpy copy of the bytes the op must read + write at least once (data, "
          "indices, ids, output), timed among the contenders. The copy reads and writes each byte once, "
          "twice the op's least traffic, so half its time is the op's floor at copy speed.\n")
    print("| indices | bytes the op must read + write | copy of them (s) | copy GB/s | floor = copy / 2 (s) | "
          "sparseserve GB/s | sparseserve / floor |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        copy_gbs = 2 * moved / r["copy"] / 1e9
        gbs = moved / r["ours"] / 1e9
        print(f"| {r['pattern']} | {moved / 1e6:,.0f} MB | {r['copy']:.4f} | {copy_gbs:.1f} | {r['copy'] / 2:.4f} | "
              f"{gbs:.1f} | {r['ours'] / (r['copy'] / 2):.2f}x |")
    record("segment", _figures(results, {"rows": rows, "width": args.width, "segments": segments}, moved),
           about=f"segment_sum of {rows:,} × {args.width} float32 rows into {segments:,} sorted segments, int64 "
                 f"indices and ids, in process against tf.sparse.segment_sum and torch.segment_reduce (given the "
                 f"segment lengths; with the permutation, after data.index_select), {threads} threads each; and "
                 "against the floor of half a numpy copy of the bytes the op must move",
           scale=args.scale, width=args.width, threads=threads, repeat=args.repeat)


def _figures(results: list[dict], sizes: dict[str, int], moved: int) -> list[dict]:
    """The rows of bench/results/segment.json: each peer's time and the bandwidth floor."""
    figures = []
    for r in results:
        case = f"segment_sum, {r['pattern']}"
        if "tf" in r:
            figures.append(figure(case, r["ours"], "tf.sparse.segment_sum", r["tf"], sizes=sizes))
        if "torch" in r:
            torch_name = ("torch.segment_reduce (lengths given)" if r["pattern"] == "indices = arange"
                          else "torch index_select + segment_reduce")
            figures.append(figure(case, r["ours"], torch_name, r["torch"], sizes=sizes))
        figures.append(figure(case, r["ours"], "floor: half a numpy copy of the bytes it must move",
                              r["copy"] / 2, sizes={**sizes, "bytes": moved}))
    return figures


if __name__ == "__main__":
    main()
