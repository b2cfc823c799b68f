"""Readiness means compiled: after ``warm_up()``, requests through the ops add no
numba signature (a new signature would be a compile inside a request)."""

from __future__ import annotations

import subprocess
import sys
import textwrap



def test_ops_after_warm_up_compile_nothing_new():
    # A fresh process, so that signatures compiled by other tests don't hide a gap.
    code = textwrap.dedent("""
        import numpy as np
        from numba.core.registry import CPUDispatcher
        from sparseserve import kernels, SparseTensor
        from sparseserve.kernels import _sort, compressed, coo, elementwise, linalg, reduce, shape, structure
        from sparseserve.server.ops import REGISTRY

        def signatures():
            return {(m.__name__, n): len(d.signatures) for m in (_sort, compressed, coo, elementwise, linalg,
                                                             reduce, shape, structure)
                    for n, d in vars(m).items() if isinstance(d, CPUDispatcher)}

        kernels.warm_up()
        before = signatures()

        def run(op, **args):
            o = REGISTRY.get(op)
            return o.run("cpu", o.bind(args))

        for dtype in ("float64", "int32", "bool", "float16", "complex64"):
            st = SparseTensor(indices=[[2, 1], [0, 3], [2, 1]], values=np.ones(3, dtype), dense_shape=[4, 5])
            hy = SparseTensor(indices=[[2], [0], [2]], values=np.ones((3, 2), dtype), dense_shape=[4, 2])
            for t in (st, hy):
                run("reorder", sp_input=t)
                c = run("coalesce", sp_input=t)[0]
                run("to_dense", sp_input=c)
                run("to_dense", sp_input=t, validate_indices=False)
                run("from_dense", tensor=run("to_dense", sp_input=c)[0])
                run("concat", axis=0, sp_inputs=[t, t])
                run("fill_empty_rows", sp_input=t, default_value=0)
                run("select", sp_input=t, index=[2])
                run("retain", sp_input=t, to_retain=np.array([True, False, True]))
            if dtype != "bool":
                run("mul", sp_input=st, dense=np.ones(5, dtype))
                run("add", a=st, b=st)
                run("add", a=st, b=np.ones((4, 5), dtype))
        # Past PARALLEL_MIN entries the kernels take their parallel paths.
        from sparseserve.kernels import PARALLEL_MIN
        rng = np.random.default_rng(0)
        for dtype in ("float64", "int8", "bool", "float16", "complex128"):
            big = SparseTensor(indices=rng.integers(0, 600, (2 * PARALLEL_MIN, 2)),
                               values=np.ones(2 * PARALLEL_MIN, dtype), dense_shape=[600, 600])
            c = run("coalesce", sp_input=big)[0]
            run("reorder", sp_input=big)
            run("from_dense", tensor=run("to_dense", sp_input=c)[0])
        run("to_indicator", sp_input=SparseTensor(indices=[[0, 0]], values=[1], dense_shape=[2, 2]), vocab_size=3)
        run("sparse_to_dense", sparse_indices=np.array([[0, 1]]), output_shape=[2, 2], sparse_values=np.array([1.0]))
        for dtype in ("float64", "int8", "uint64", "float16", "complex128"):
            st = SparseTensor(indices=[[2, 1], [0, 3], [2, 1]], values=np.ones(3, dtype), dense_shape=[4, 5])
            hy = SparseTensor(indices=[[2], [0], [2]], values=np.ones((3, 2), dtype), dense_shape=[4, 2])
            for t in (st, hy):
                for op in ("reduce_sum", "reduce_max")[:1 if dtype == "complex128" else 2]:
                    for axis in (None, 0, [1], []):
                        run(op, sp_input=t, axis=axis)
                        run(op, sp_input=t, axis=axis, keepdims=True, output_is_sparse=True)
                if dtype.startswith("float"):
                    run("softmax", sp_input=t, axis=0)
                    run("log_softmax", sp_input=t)
            if dtype != "complex128":
                run("maximum", sp_a=st, sp_b=st)
                run("minimum", sp_a=hy, sp_b=hy)
        for dtype in ("float64", "int8", "float32"):
            big = SparseTensor(indices=rng.integers(0, 600, (2 * PARALLEL_MIN, 2)),
                               values=np.ones(2 * PARALLEL_MIN, dtype), dense_shape=[600, 600])
            for op in ("reduce_sum", "reduce_max"):
                run(op, sp_input=big, axis=0)
                run(op, sp_input=big, axis=[])
                run(op, sp_input=big, axis=1, output_is_sparse=True)
            if dtype != "int8":
                run("softmax", sp_input=big, axis=0)
                run("log_softmax", sp_input=big, axis=1)
            run("maximum", sp_a=big, sp_b=big)
        for dtype in ("float64", "int8", "bool", "float16", "complex128"):
            st = SparseTensor(indices=[[2, 1], [0, 3], [2, 1]], values=np.ones(3, dtype), dense_shape=[4, 5])
            hy = SparseTensor(indices=[[2], [0], [2]], values=np.ones((3, 2, 3), dtype), dense_shape=[4, 2, 3])
            run("transpose", sp_input=st)
            run("transpose", sp_input=hy, perm=[0, 2, 1])
            run("reshape", sp_input=st, shape=[2, -1, 5])
            run("reshape", sp_input=hy, shape=[2, 2, 2, 3])
            run("slice", sp_input=st, start=[1, 1], size=[3, 9])
            run("slice", sp_input=hy, start=[1, 0, 1], size=[3, 2, 1])
        compressed_inputs = [
            SparseTensor(layout="csr", compressed_indices=[0, 1, 3], plain_indices=[1, 0, 2], values=np.ones(3),
                         dense_shape=[2, 4]),
            SparseTensor(layout="csc", compressed_indices=[0, 1, 2, 3, 3], plain_indices=[1, 0, 1],
                         values=np.ones(3), dense_shape=[2, 4]),
            SparseTensor(layout="bsr", compressed_indices=[0, 1, 2], plain_indices=[0, 1], values=np.ones((2, 1, 2)),
                         dense_shape=[2, 4], blocksize=[1, 2]),
            SparseTensor(layout="bsc", compressed_indices=[0, 1, 2, 2, 2], plain_indices=[0, 0],
                         values=np.ones((2, 2, 1)), dense_shape=[2, 4], blocksize=[2, 1]),
            SparseTensor(layout="csr", compressed_indices=[[0, 1, 3], [0, 1, 3]], plain_indices=[[1, 0, 2], [1, 0, 2]],
                         values=np.ones((2, 3)), dense_shape=[2, 2, 4])]
        for c in compressed_inputs:
            run("transpose", sp_input=c)
            run("reshape", sp_input=c, shape=[-1])
            run("slice", sp_input=c, start=[0] * c.ndim, size=[1] * c.ndim)
        for dtype in ("float64", "int8", "bool", "float16", "complex128"):
            big = SparseTensor(indices=rng.integers(0, 600, (2 * PARALLEL_MIN, 3)),
                               values=np.ones(2 * PARALLEL_MIN, dtype), dense_shape=[600, 600, 600])
            run("transpose", sp_input=big, perm=[2, 0, 1])
            run("reshape", sp_input=big, shape=[3600, -1])
            run("slice", sp_input=big, start=[10, 20, 30], size=[500, 500, 500])
        layouts = ("coo", "csr", "csc", "bsr", "bsc")

        def to(t, layout):
            return run("convert", sp_input=t, layout=layout,
                       **({"blocksize": [2, 2]} if layout in ("bsr", "bsc") else {}))[0]

        for dtype in ("float64", "int8", "bool", "float16", "complex128", "uint64"):
            small = SparseTensor(indices=[[2, 1], [0, 3], [2, 0]], values=np.ones(3, dtype), dense_shape=[4, 6])
            big = SparseTensor(indices=rng.integers(0, 600, (2 * PARALLEL_MIN, 2)),
                               values=np.ones(2 * PARALLEL_MIN, dtype), dense_shape=[600, 600])
            for t in (small, run("coalesce", sp_input=big)[0]):
                for source in layouts:
                    s = to(t, source)
                    for target in layouts:
                        to(s, target)
            for t in (small, big):
                c = to(t, "csr")
                c32 = SparseTensor(layout="csr", compressed_indices=c.compressed_indices.astype("int32"),
                                   plain_indices=c.plain_indices.astype("int32"), values=c.values,
                                   dense_shape=c.dense_shape)
                for target in layouts:
                    to(c32, target)
        for dtype in ("float64", "float32", "int32", "int8", "float16", "complex128", "uint64"):
            for n in (6, 2 * PARALLEL_MIN):
                diag = SparseTensor(indices=np.repeat(np.arange(n), 2).reshape(n, 2), values=np.ones(n, dtype),
                                    dense_shape=[n, n])
                for index in ("int64", "int32"):
                    csr = to(diag, "csr")
                    csr = SparseTensor(layout="csr", compressed_indices=csr.compressed_indices.astype(index),
                                       plain_indices=csr.plain_indices.astype(index), values=csr.values,
                                       dense_shape=csr.dense_shape)
                    csc = to(csr, "csc")
                    for a in (csr, csc, diag):
                        for adjoint in (False, True):
                            run("matmul", a=a, b=np.ones(n, dtype), adjoint_a=adjoint)
                            run("matmul", a=a, b=np.ones((n, 3), dtype), adjoint_a=adjoint)
                            run("matmul", a=np.ones((2, n), dtype), b=a, adjoint_b=adjoint)
                        run("matmul", a=a, b=a)
                        run("sampled_addmm", input=a, mat1=np.ones((n, 2), dtype), mat2=np.ones((2, n), dtype))
            batched = SparseTensor(indices=[[0, 1, 1], [1, 0, 2]], values=np.ones(2, dtype), dense_shape=[2, 3, 3])
            batched = to(batched, "csr")
            run("matmul", a=batched, b=np.ones((2, 3, 2), dtype))
            run("sampled_addmm", input=batched, mat1=np.ones((2, 3, 2), dtype), mat2=np.ones((2, 2, 3), dtype))
        grown = {k: (before.get(k, 0), v) for k, v in signatures().items() if v != before.get(k, 0)}
        print("GROWN", grown)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "GROWN {}" in result.stdout, result.stdout


def test_a_failed_warm_up_is_logged_and_the_server_exits_non_zero():
    """A warm-up that raises must not leave a server up and never ready with nothing said."""
    import subprocess
    import sys

    script = (
        "import sparseserve.server.service as s\n"
        "def broken(self): raise RuntimeError('kernel cache unreadable')\n"
        "s.Service.warm_up = broken\n"
        "from sparseserve.server import main\n"
        "raise SystemExit(main(['--grpc-port', '0', '--http-port', '0', '--log-level', 'warning']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert '"event": "warm_up_failed"' in done.stdout and "kernel cache unreadable" in done.stdout
    assert "warm-up failed" in done.stderr and "RuntimeError" in done.stderr
    assert '"event": "ready"' not in done.stdout
