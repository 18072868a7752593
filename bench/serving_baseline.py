"""The same-run baseline of ``bench/serving.py``: a plain FastAPI endpoint over the same model.

    python bench/serving_baseline.py MODEL.pt2 [--threads 1] [--name mlp] [--features 512]

What a team writes without a serving platform: one uvicorn process (the same server, HTTP
parser and event loop the serving service uses, no access log), one ``POST
/v2/models/{name}/infer`` endpoint that reads the body, decodes the Open Inference Protocol JSON
with orjson, runs the ``torch.export`` artefact the registry stores (loaded with
``torch.export.load``) on the request's rows alone — no batching, no queue, no auth, no
metrics — in anyio's thread pool (so two requests compute at once on two cores, as the
service's two instances do; torch and numpy release the GIL) and answers the protocol's JSON.
``--threads`` is torch's intra-op thread count (the service's ``TORCH_THREADS``).

It binds 127.0.0.1 on a free port and prints ``PORT <n>`` on stdout once it accepts
connections; it serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from typing import Any

import numpy as np
import orjson
import torch
import uvicorn
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

_DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}


def create_app(module: Any, name: str) -> FastAPI:
    """The one-endpoint app over ``module`` (a callable on a torch tensor)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out: np.ndarray = module(torch.from_numpy(x)).numpy()
        return out

    @app.post("/v2/models/{model}/infer")
    async def infer(request: Request) -> Response:
        doc = orjson.loads(await request.body())
        tensor = doc["inputs"][0]
        x = np.asarray(tensor["data"], dtype=_DTYPES[tensor["datatype"]])
        out = await run_in_threadpool(run, x.reshape(tensor["shape"]))
        answer = {
            "model_name": name,
            "model_version": "1",
            "outputs": [
                {
                    "name": "OUTPUT__0",
                    "datatype": "FP32",
                    "shape": list(out.shape),
                    "data": out.ravel().tolist(),
                }
            ],
        }
        return Response(orjson.dumps(answer), media_type="application/json")

    return app


async def serve(path: str, name: str, features: int) -> None:
    """Load the artefact, bind a free port, say which, serve."""
    module = torch.export.load(path).module()
    with torch.inference_mode():  # the first calls pay for lazy initialisation
        for rows in (1, 32, 1):
            module(torch.rand(rows, features))
    # IPPROTO_TCP, as uvicorn's own bind does: asyncio sets TCP_NODELAY on accepted connections
    # only when the listening socket says so (proto 0 leaves Nagle on: +40 ms per response)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(create_app(module, name), log_config=None, access_log=False, lifespan="off")
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():  # uvicorn has no "started" event
        await asyncio.sleep(0.01)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a torch.export artefact (.pt2)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--name", default="mlp", help="the model name it answers with")
    parser.add_argument("--features", type=int, default=512, help="the input's row width")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)
    asyncio.run(serve(args.model, args.name, args.features))
    return 0


if __name__ == "__main__":
    sys.exit(main())
