"""Pipelines: a chain of ops in one request equals the same calls made one by one, on every
wire; every step is checked before the first runs; errors name the step."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from sparseserve import InvalidArgumentError, NotFoundError, OutputRef, RemoteTensor, SparseTensor
from sparseserve.server.config import ServerConfig
from sparseserve.server.ops import REGISTRY
from sparseserve.server.service import Service
from strategies import random_coo


def sample(seed: int = 0, nnz: int = 40) -> SparseTensor:
    """Unsorted COO with repeated entries, values 1.0 to 4.0."""
    return random_coo(np.random.default_rng(seed), (6, 7), nnz, values={"low": 1, "high": 4, "halves": False})


def test_a_chain_equals_the_calls_one_by_one(client):
    sp, scale = sample(), np.arange(1.0, 8.0)
    expect = client.reduce_sum(client.mul(client.coalesce(sp), scale), axis=1)
    p = client.pipeline()
    summed = p.coalesce(sp)
    scaled = p.mul(summed, dense=scale)
    p.reduce_sum(scaled.output, axis=1)
    np.testing.assert_array_equal(p.run(), expect)


def test_chosen_outputs_of_several_steps_and_multi_output_ops(client):
    sp = sample(1)
    p = client.pipeline()
    c = p.coalesce(sp, name="c")
    filled = p.fill_empty_rows(c, default_value=-1.0, name="f")
    dense = p.to_dense(filled.output, default_value=0.0)
    got_c, indicator, got_dense = p.run(c.output, filled.empty_row_indicator, dense[0])
    out, ind = client.fill_empty_rows(client.coalesce(sp), default_value=-1.0)
    np.testing.assert_array_equal(got_c.to_dense(), client.coalesce(sp).to_dense())
    np.testing.assert_array_equal(indicator, ind)
    np.testing.assert_array_equal(got_dense, client.to_dense(out))


def test_keep_returns_handles_and_inputs_may_be_handles(client):
    kept = client.put(sample(2))
    p = client.pipeline()
    p.to_dense(p.coalesce(kept))
    handle = p.run(keep=True)
    assert isinstance(handle, RemoteTensor)
    np.testing.assert_array_equal(handle.get(), client.to_dense(client.coalesce(sample(2))))
    handle.delete()
    kept.delete()


@pytest.mark.parametrize("build, error, reason", [
    (lambda p: None, InvalidArgumentError, "EMPTY_PIPELINE"),
    (lambda p: (p.coalesce(sample(), name="a"), p.coalesce(sample(), name="a")), InvalidArgumentError,
     "BAD_STEP_NAME"),
    (lambda p: p.add("coalesce", sp_input=OutputRef("later.output")), InvalidArgumentError, "UNKNOWN_REF"),
    (lambda p: p.to_dense(p.coalesce(sample()), default_value=OutputRef("s0.output")), InvalidArgumentError,
     "BAD_REF"),
    (lambda p: p.add("coalesce", sp_input=sample(), bogus=1), InvalidArgumentError, "UNKNOWN_ARGUMENT"),
    (lambda p: p.add("to_dense"), InvalidArgumentError, "MISSING_ARGUMENT"),
    (lambda p: p.add("coalesce", sp_input=SparseTensor(indices=[[9, 0]], values=[1.0], dense_shape=[2, 2])),
     InvalidArgumentError, "INDEX_OUT_OF_RANGE"),
])
def test_malformed_pipelines_are_refused_naming_the_problem(client, build, error, reason):
    p = client.pipeline()
    build(p)
    with pytest.raises(error) as info:
        p.run()
    assert info.value.reason == reason


def test_unknown_op_and_unknown_output(client):
    with pytest.raises(NotFoundError) as info:
        client._run_pipeline([("x", "no_such_op", {})], [], False)
    assert info.value.reason == "UNKNOWN_OP" and "step 'x'" in info.value.message
    p = client.pipeline()
    p.coalesce(sample())
    with pytest.raises(InvalidArgumentError) as info:
        p.run(OutputRef("s0.nope"))
    assert info.value.reason == "UNKNOWN_OUTPUT"


def test_a_failing_step_is_named(client):
    ints = sample(3)
    ints = SparseTensor(indices=ints.indices, values=ints.values.astype(np.int64), dense_shape=ints.dense_shape)
    p = client.pipeline()
    s = p.coalesce(ints, name="first")
    p.div(s, dense=np.zeros(7, np.int64), name="divide")  # an integer zero divisor at stored entries
    with pytest.raises(InvalidArgumentError) as info:
        p.run()
    assert "step 'divide'" in info.value.message


def test_references_outside_pipelines_are_refused(client):
    with pytest.raises(InvalidArgumentError) as info:
        client.coalesce(OutputRef("s0.output"))
    assert info.value.reason == "BAD_REF"


def test_every_step_is_checked_before_the_first_runs(monkeypatch):
    """In process: the first step's kernel must not run when a later step is malformed."""
    service = Service(ServerConfig(), REGISTRY)
    ran = []
    op = REGISTRY.get("coalesce")
    monkeypatch.setitem(op.kernels, "cpu", lambda **kw: ran.append(1) or (_ for _ in ()).throw(AssertionError))
    steps = [("a", "coalesce", {"sp_input": sample()}),
             ("b", "to_dense", {"sp_input": OutputRef("a.output"), "default_value": "not a number"})]
    with pytest.raises(InvalidArgumentError) as info:
        asyncio.run(service.execute_pipeline(steps, [], False, ""))
    assert info.value.reason == "BAD_ARGUMENT_TYPE" and "step 'b'" in info.value.message
    assert not ran
    service.close()


def test_rest_json_pipeline_without_the_sdk(server):
    import httpx

    body = {"steps": [
        {"name": "c", "op": "coalesce",
         "args": {"sp_input": {"indices": [[1, 1], [0, 0], [1, 1]], "values": [1, 2, 3], "dense_shape": [2, 2]}}},
        {"name": "d", "op": "to_dense", "args": {"sp_input": {"ref": "c.output"}}}]}
    reply = httpx.post(f"{server.http_url}/v1/pipelines", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"]["d.output"]["data"] == [2, 0, 0, 4]


def test_async_client_pipeline(server):
    from sparseserve import AsyncClient

    async def main():
        async with AsyncClient(server.grpc_target) as c:
            await c.list_ops()
            p = c.pipeline()
            p.to_dense(p.coalesce(sample(4)))
            return await p.run()

    np.testing.assert_array_equal(asyncio.run(main()), sample(4).to_dense())
