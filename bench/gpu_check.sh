#!/usr/bin/env bash
# The CUDA paths of the training runtime, on a machine with an NVIDIA GPU (under 8 minutes):
#   1. NCCL with 1 GPU (a 1-rank process group through the runtime's trainer)
#   2. bf16 and fp16 AMP (dynamic loss scaling) on CUDA
#   3. a fractional-GPU worker (GANTRY_GPU_MEMORY_FRACTION=0.5 through the worker main)
#   4. the int8 / int4 / PowerSGD / fp16 compression hooks on CUDA tensors (2 ranks on 1 GPU,
#      gloo for the collective when only one GPU is visible, NCCL when there are two)
#   5. serving on CUDA: an exported model loaded by the serving runtime on cuda:0 (torch.export
#      and TorchScript), warmed up, batched through the dynamic batcher, outputs equal to CPU
# Prints one JSON object with the figures as its last line. Run: bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || { make install >/dev/null; }
export PYTHONUNBUFFERED=1
exec timeout 470 "$PY" - <<'EOF'
import json, os, subprocess, sys, tempfile, textwrap, time
import torch

out = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available()}
if not torch.cuda.is_available():
    print("no CUDA GPU visible: nothing to check", file=sys.stderr)
    print(json.dumps(out)); sys.exit(1)
out["gpu"] = torch.cuda.get_device_name(0)
out["gpus"] = torch.cuda.device_count()

from gantry.training.trainer import Trainer, TrainingOptions, WorkerEnv

def model():
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))

def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8192, 256, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, :10].argmax(1)))

ce = torch.nn.functional.cross_entropy
for precision in ("fp32", "bf16", "fp16"):
    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp()
    env = WorkerEnv(rank=0, world_size=1, init_method=f"file://{tmp}/rdv")
    opts = TrainingOptions(precision=precision, micro_batch_size=256, epochs=3, lr=1e-3)
    history = Trainer(model, ce, data, options=opts, env=env).fit()
    torch.cuda.synchronize()
    out[f"final_loss_{precision}"] = round(history[-1], 4)
    out[f"seconds_{precision}"] = round(time.perf_counter() - t0, 2)

# NCCL with one GPU: a 1-rank group through the trainer's own join (world of 1 skips it, so
# join explicitly and run an all-reduce the way DDP would)
import torch.distributed as dist
tmp = tempfile.mkdtemp()
dist.init_process_group("nccl", init_method=f"file://{tmp}/nccl", rank=0, world_size=1,
                        device_id=torch.device("cuda", 0))
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
out["nccl_all_reduce_ok"] = bool(t[0].item() == 1.0)
dist.destroy_process_group()

# the compression hooks on CUDA tensors: 2 ranks (gloo when only 1 GPU, NCCL with 2)
worker = textwrap.dedent('''
    import json, os, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from gantry.training.compression import register_compression
    rank, world, mode = int(sys.argv[1]), 2, sys.argv[2]
    gpus = torch.cuda.device_count()
    dev = torch.device("cuda", rank % gpus)
    torch.cuda.set_device(dev)
    backend = "nccl" if gpus >= 2 else "gloo"
    dist.init_process_group(backend, init_method="file://" + sys.argv[3], rank=rank, world_size=world)
    torch.manual_seed(0)
    m = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev),
            device_ids=[dev.index])
    stats = register_compression(m, mode, powersgd_start_iter=2) if mode != "none" else None
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    for step in range(60):
        x = torch.randn(128, 256, generator=g).to(dev); y = x[:, :10].argmax(1)
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    t = loss.detach().clone(); dist.all_reduce(t); t /= world
    if rank == 0:
        print(json.dumps({"backend": backend, "loss": float(t),
                          "bytes_per_step": stats.bytes_per_step if stats else 0,
                          "ratio": stats.compression_ratio if stats else 1.0}))
    del m; import gc; gc.collect(); dist.destroy_process_group(); os._exit(0)
''')
with tempfile.TemporaryDirectory() as d:
    script = os.path.join(d, "w.py")
    open(script, "w").write(worker)
    for mode in ("none", "fp16", "int8", "int4", "powersgd"):
        rdv = os.path.join(d, f"rdv-{mode}")
        procs = [subprocess.Popen([sys.executable, script, str(r), mode, rdv], stdout=subprocess.PIPE, text=True)
                 for r in range(2)]
        outs = [p.communicate(timeout=180)[0] for p in procs]
        line = [l for l in outs[0].splitlines() if l.startswith("{")]
        out[f"compression_{mode}"] = json.loads(line[-1]) if line else {"error": f"exit {procs[0].returncode}"}

# a fractional-GPU worker through the runtime's worker main
task = textwrap.dedent('''
    import torch
    from gantry.training import Task
    def model(): return torch.nn.Linear(64, 2)
    def dataset(ctx):
        x = torch.randn(2048, 64); return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    def report(m, ctx):
        return {"memory_fraction_cap": float(torch.cuda.get_per_process_memory_fraction(0))
                if hasattr(torch.cuda, "get_per_process_memory_fraction") else -1.0}
    task = Task(model=model, loss=torch.nn.functional.cross_entropy, dataset=dataset, evaluate=report,
                options={"epochs": 2, "micro_batch_size": 128}, register=False)
''')
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, "fractask.py"), "w").write(task)
    env = {**os.environ, "PYTHONPATH": d, "GANTRY_DATA_DIR": d, "GANTRY_GPU_MEMORY_FRACTION": "0.5",
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    r = subprocess.run([sys.executable, "-m", "gantry.training.run", "fractask:task"], env=env,
                       capture_output=True, text=True, timeout=180)
    out["fractional_gpu_exit"] = r.returncode
    out["fractional_gpu_capped"] = "gpu memory capped at 50%" in r.stdout
    out["fractional_gpu_tail"] = r.stdout.strip().splitlines()[-1:] + r.stderr.strip().splitlines()[-2:]

# serving on CUDA: the runtime loads exported artefacts onto the GPU; the batcher runs them
import asyncio, io, warnings
import numpy as np
from gantry.training.export import export_model
from gantry.serving.runtime import Artifact, load_model
from gantry.serving.batcher import BatchingConfig, DynamicBatcher
torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).eval()
x = np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)
expected = mlp(torch.from_numpy(x)).detach().numpy()
with tempfile.TemporaryDirectory() as d:
    for fmt_wanted in ("torch.export", "torchscript"):
        if fmt_wanted == "torch.export":
            name, fmt, sig = export_model(mlp, torch.from_numpy(x[:2]), __import__("pathlib").Path(d) / "e")
            data = open(os.path.join(d, "e", name), "rb").read()
        else:
            buf = io.BytesIO()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.jit.save(torch.jit.trace(mlp, torch.from_numpy(x[:2])), buf)
            data, fmt = buf.getvalue(), "torchscript"
            sig = {"inputs": [{"shape": [-1, 512], "dtype": "float32"}], "outputs": [{"shape": [-1, 10], "dtype": "float32"}]}
        t0 = time.perf_counter()
        loaded = load_model(Artifact("mlp", 1, data, fmt, sig), device="cuda:0")
        warm = loaded.warm_up(32)
        async def batched():
            b = DynamicBatcher(loaded.run, BatchingConfig(max_batch_size=32, max_queue_delay_us=2000), instances=2, max_instances=2)
            outs = await asyncio.gather(*(b.submit([x[i:i + 1]]) for i in range(64)))
            await b.close()
            return np.concatenate([o[0] for o in outs])
        got = asyncio.run(batched())
        out[f"serving_cuda_{fmt}"] = {
            "device": loaded.device, "load_s": round(time.perf_counter() - t0, 3), "warm_up_s": round(warm, 3),
            "max_abs_diff_vs_cpu": float(np.abs(got - expected).max()),
            "ok": bool(np.allclose(got, expected, atol=1e-3)),
        }
    try:
        load_model(Artifact("mlp", 1, data, "torchscript", sig), device="cuda:0", quantize=True)
        out["serving_cuda_int8_refused"] = False
    except Exception as exc:
        out["serving_cuda_int8_refused"] = "CPU" in str(exc) or "cpu" in str(exc)

# profiler input on CUDA: step phases timed with CUDA events (kernels, not launches) add up
from gantry.training.trainer import Trainer, TrainingOptions, WorkerEnv
seen = []
net = lambda: torch.nn.Sequential(torch.nn.Linear(512, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1))
data = lambda: torch.utils.data.TensorDataset(torch.randn(4096, 512), torch.randn(4096, 1))
Trainer(net, torch.nn.functional.mse_loss, data, options=TrainingOptions(micro_batch_size=256, max_steps=12, device="cuda:0"),
        env=WorkerEnv(), callbacks=[seen.append]).fit()
late = seen[4:]
phases = sum(m.data_s + m.forward_s + m.backward_s + m.comm_s + m.optimizer_s for m in late)
steps = sum(m.step_s for m in late)
out["profiler_cuda_phases"] = {
    "forward_ms": round(1000 * sum(m.forward_s for m in late) / len(late), 3),
    "backward_ms": round(1000 * sum(m.backward_s for m in late) / len(late), 3),
    "optimizer_ms": round(1000 * sum(m.optimizer_s for m in late) / len(late), 3),
    "comm_ms": round(1000 * sum(m.comm_s for m in late) / len(late), 3),
    "phases_over_step": round(phases / steps, 3),
    "ok": all(m.forward_s > 0 and m.backward_s > 0 for m in late) and 0.9 < phases / steps <= 1.01,
}

print(json.dumps(out))
EOF
