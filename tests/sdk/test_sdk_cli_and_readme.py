"""The command line, its environment variables, tokens, graceful shutdown, and
the README's quickstart run against a real server."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from sparseserve import (Client, ResourceExhaustedError, SparseTensor, UnauthenticatedError)
from sparseserve.server.config import build_parser, env_name

from conftest import ServerProcess
from helpers import example, examples

ROOT = Path(__file__).resolve().parent.parent.parent
README = (ROOT / "README.md").read_text()
CURL_EXAMPLES = ("curl-coalesce", "curl-error", "curl-pipeline")  # each answered by "<tag>-output"


@pytest.mark.parametrize("path, tag", [("README.md", "quickstart"), ("docs/sdk.md", "pipeline"),
                                       ("README.md", "solvers"), ("docs/semantics.md", "linear-algebra")],
                         ids=["quickstart", "pipeline", "solvers", "linear-algebra"])
def test_readme_sdk_examples_print_what_they_say(server, path, tag):
    code = example(path, tag).replace("localhost:50051", server.grpc_target)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == example(path, f"{tag}-output")


def test_readme_curl_examples_answer_what_they_say(server):
    tagged = examples("README.md")
    # Every curl command and JSON answer in the README is one of these (a new one needs a tag).
    assert sorted(b for b in re.findall(r"```sh\n(.*?)```", README, flags=re.S) if "curl " in b) == \
        sorted(tagged[tag] for tag in CURL_EXAMPLES)
    assert sorted(re.findall(r"```json\n(.*?)```", README, flags=re.S)) == \
        sorted(tagged[f"{tag}-output"] for tag in CURL_EXAMPLES)
    for tag in CURL_EXAMPLES:
        command, answer = tagged[tag], tagged[f"{tag}-output"]
        path = re.search(r"localhost:8000(\S+)", command).group(1)
        body = re.search(r"-d '(.*)'", command, flags=re.S).group(1)
        headers = dict(re.findall(r"-H '([^:]+): ([^']*)'", command))
        r = httpx.post(server.http_url + path, content=body, headers=headers)
        assert r.json() == json.loads(answer)
        assert r.status_code == (400 if "error" in answer else 200)


def test_every_flag_and_its_environment_variable_is_documented():
    flags = [a for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    assert flags
    for action in flags:
        assert f"`{action.option_strings[0]}`" in README, action.option_strings[0]
        assert env_name(action.dest).startswith("SPARSESERVE_")
    assert "SPARSESERVE_<FLAG>" in README


def test_help_lists_the_flags():
    result = subprocess.run([sys.executable, "-m", "sparseserve.cli", "serve", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag in ("--grpc-port", "--http-port", "--max-result-bytes", "--store-bytes", "--token"):
        assert flag in result.stdout


def test_environment_configures_and_tokens_guard_both_wires(tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("# tenant token\nalice secret-a\nbob secret-b\n")
    srv = ServerProcess(env={"SPARSESERVE_MAX_RESULT_BYTES": "1000",
                             "SPARSESERVE_TOKEN_FILE": str(token_file)})
    try:
        st = SparseTensor(indices=[[0, 0]], values=[1.0], dense_shape=[20, 20])  # 3200 bytes dense
        for target in (srv.grpc_target, srv.http_url):
            with Client(target) as anonymous:
                with pytest.raises(UnauthenticatedError):
                    anonymous.call("coalesce", sp_input=st)
            with Client(target, token="wrong") as wrong:
                with pytest.raises(UnauthenticatedError) as info:
                    wrong.call("coalesce", sp_input=st)
                assert info.value.reason == "BAD_TOKEN"
            with Client(target, token="secret-a") as alice, Client(target, token="secret-b") as bob:
                with pytest.raises(ResourceExhaustedError, match="over the result limit of 1000 bytes"):
                    alice.to_dense(st)
                h = alice.put(st)
                with pytest.raises(Exception) as info:
                    bob.get(h)
                assert info.value.code == "PERMISSION_DENIED"
                np.testing.assert_array_equal(alice.get(h).values, [1.0])
        assert httpx.get(f"{srv.http_url}/v1/ops").status_code == 401
        assert httpx.get(f"{srv.http_url}/healthz").status_code == 200  # probes need no token
    finally:
        assert srv.stop() == 0


def test_sigterm_stops_both_wires_and_exits_zero():
    srv = ServerProcess()
    with Client(srv.grpc_target) as c:
        h = c.put(np.zeros((2000, 2000)))
        assert c.from_dense(h).nnz == 0
    assert srv.stop(signal.SIGTERM) == 0
    assert any(e.get("event") == "stopped" for e in srv.events)


def test_a_request_limit_past_grpcs_message_limit_is_refused_at_start(capsys):
    from sparseserve.server.config import MAX_REQUEST_BYTES_LIMIT, config_from_args

    assert config_from_args(["--max-request-bytes", str(MAX_REQUEST_BYTES_LIMIT)]).max_request_bytes \
        == MAX_REQUEST_BYTES_LIMIT
    with pytest.raises(SystemExit):
        config_from_args(["--max-request-bytes", str(4 << 30)])
    assert "--max-request-bytes must be between 1 and" in capsys.readouterr().err
