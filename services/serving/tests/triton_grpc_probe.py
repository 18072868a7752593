"""Drives a serving gRPC endpoint with the official ``tritonclient.grpc``; prints a JSON report.

Run as ``python triton_grpc_probe.py HOST:PORT`` by ``test_triton_client.py``, in its own
process: ``tritonclient.grpc`` registers its own copy of the ``inference.*`` protobuf messages,
which cannot share a process with ``gantry.protos.inference``.
"""

from __future__ import annotations

import queue
import sys
from typing import Any

import numpy as np
import orjson
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def main(url: str) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(url=url)
    report: dict[str, Any] = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "double_ready": client.is_model_ready("double"),
        "loading_ready": client.is_model_ready("loading"),
        "server_metadata": client.get_server_metadata(as_json=True),
        "metadata": client.get_model_metadata("double", as_json=True),
    }

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(
        "double",
        [inp],
        model_version="1",
        request_id="g-1",
        outputs=[grpcclient.InferRequestedOutput("OUTPUT0")],
    )
    response = result.get_response(as_json=True)
    report["infer"] = {
        "model_version": response["model_version"],
        "id": response["id"],
        "outputs": [o["name"] for o in response["outputs"]],
        "OUTPUT0": result.as_numpy("OUTPUT0").tolist(),
    }

    words = np.array([b"hello", b"", "w\u00f6rld".encode()], dtype=object)
    half = np.array([0.5, -2.0, 65504.0], dtype=np.float16)
    text_in = grpcclient.InferInput("text", [3], "BYTES")
    text_in.set_data_from_numpy(words)
    half_in = grpcclient.InferInput("half", [3], "FP16")
    half_in.set_data_from_numpy(half)
    echoed = client.infer("echo", [text_in, half_in])
    report["echo"] = {
        "text": [w.decode() for w in echoed.as_numpy("text").tolist()],
        "half": echoed.as_numpy("half").tolist(),
        "half_dtype": str(echoed.as_numpy("half").dtype),
    }

    errors = {}
    for model in ("busy", "nope", "broken"):
        try:
            client.infer(model, [inp])
        except InferenceServerException as exc:
            errors[model] = {"status": exc.status(), "message": exc.message()}
    report["errors"] = errors

    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    prompt = grpcclient.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"one two three four"], dtype=object))
    client.async_stream_infer("gpt", [prompt], request_id="s-1", parameters={"max_tokens": 3})
    pieces = []
    while True:
        result, error = replies.get(timeout=10)
        assert error is None, error
        response = result.get_response(as_json=True)
        final = response["parameters"]["triton_final_response"]["bool_param"]
        pieces.append(
            {
                "text": result.as_numpy("text_output").reshape(-1)[0].decode(),
                "final": final,
                "id": response["id"],
            }
        )
        if final:
            break
    client.async_stream_infer("nope", [prompt])
    result, error = replies.get(timeout=10)
    report["stream"] = {
        "pieces": pieces,
        "error": None if error is None else error.message(),
    }
    client.stop_stream()
    client.close()
    return report


if __name__ == "__main__":
    sys.stdout.write(orjson.dumps(main(sys.argv[1])).decode())
