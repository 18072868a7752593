"""The training loop: convergence, determinism, DDP and FSDP on gloo, accumulation, precision,
activation checkpointing, stop on SIGTERM, the checkpoint hook's resume contract and rank 0's
evaluations during training."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from gantry.core import ConfigError, Conflict
from gantry.sched.spec import Privacy, Training
from gantry.training.precision import Precision, resolve_precision
from gantry.training.progress import ProgressReporter
from gantry.training.seeding import (
    capture_rng_state,
    derive_seed,
    restore_rng_state,
    seed_everything,
    set_deterministic,
)
from gantry.training.trainer import (
    EpochEvaluation,
    Hooks,
    SaveReason,
    StepMetrics,
    Trainer,
    TrainingOptions,
    TrainState,
    WorkerEnv,
    checkpoint_activations,
)

ROOT = Path(__file__).resolve().parents[3]  # the checkout: spawned ranks import this module
SAMPLES = 256


def regression() -> TensorDataset:
    """y = tanh(x.w / 3) + noise (std 0.05, so the best mean squared error is 0.0025)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    return TensorDataset(x, torch.tanh(x @ w / 3) + 0.05 * torch.randn(SAMPLES, 1, generator=g))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def sgd(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def options(**changes: Any) -> TrainingOptions:
    # device="cpu": the figures below are CPU figures, even on a machine with a GPU
    base = {"micro_batch_size": 32, "epochs": 12, "optimizer": sgd, "device": "cpu"}
    return TrainingOptions(**(base | changes))


def train(opts: TrainingOptions, **kwargs: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    trainer = Trainer(mlp, mse, regression, options=opts, env=WorkerEnv(), **kwargs)
    history = trainer.fit()
    return history, {k: v.detach().clone() for k, v in trainer.state.module.state_dict().items()}


def assert_params_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


# -- 1. one worker: convergence and determinism --------------------------------------------------


def test_one_worker_fits_the_regression_and_a_rerun_is_identical() -> None:
    metrics: list[StepMetrics] = []
    first, params = train(options(), callbacks=[metrics.append])
    second, params_again = train(options())

    assert len(first) == 12 * SAMPLES // 32
    assert first[0] > 0.3
    assert sum(first[-8:]) / 8 < 0.008  # the noise floor is 0.0025
    assert first == second  # bit for bit
    assert_params_close(params, params_again, atol=0)
    assert [m.step for m in metrics] == list(range(1, len(first) + 1))
    assert metrics[-1].epoch == 11 and metrics[-1].rank == 0
    assert metrics[0].eta_s is None and metrics[-1].eta_s == 0
    assert all(m.samples_per_s > 0 for m in metrics)
    assert train(options(seed=1))[0] != first


def test_max_steps_ends_the_run_early() -> None:
    history, _ = train(options(max_steps=5))
    assert len(history) == 5


def test_a_trainer_trains_once() -> None:
    trainer = Trainer(mlp, mse, regression, options=options(max_steps=1), env=WorkerEnv())
    trainer.fit()
    with pytest.raises(Conflict, match="already trained"):
        trainer.fit()


# -- 2 and 5. two workers on gloo: DDP and FSDP -------------------------------------------------


def _rank_main(rank: int, store: str, out: str, fsdp: bool, micro: int) -> None:
    warnings.simplefilter("error")  # the ranks are as strict as the test process
    torch.set_num_threads(1)
    env = WorkerEnv(rank=rank, world_size=2, init_method=f"file://{store}")  # gloo on CPU
    with Trainer(mlp, mse, regression, options=options(fsdp=fsdp, micro_batch_size=micro),
                 env=env) as trainer:  # fmt: skip
        history = trainer.fit()
        params = {
            name: (value.full_tensor() if hasattr(value, "full_tensor") else value).detach()
            for name, value in trainer.state.module.state_dict().items()
        }
    torch.save({"history": history, "params": params}, f"{out}/rank{rank}.pt")
    # skip interpreter teardown: gloo's threads can abort it ("terminate called without an
    # active exception"), as test_compression found
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_two_ranks(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    fsdp: bool,
    micro: int = 16,
    main: Any = _rank_main,
) -> list[dict[str, Any]]:
    monkeypatch.syspath_prepend(str(ROOT))  # spawned children inherit sys.path
    args = (str(tmp_path / "store"), str(tmp_path), fsdp, micro)
    ranks = mp.spawn(main, args=args, nprocs=2, join=False)
    deadline = time.monotonic() + 60
    try:
        while not ranks.join(timeout=0.5):  # raises when a rank failed
            assert time.monotonic() < deadline, "the ranks did not finish within 60 s"
    finally:
        for process in ranks.processes:  # leave no rank behind, whatever happened
            if process.is_alive():
                process.kill()
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]


@pytest.fixture(scope="module")
def single_worker_run() -> tuple[list[float], dict[str, torch.Tensor]]:
    """The one-worker run with the same global batch (32) as two workers of 16."""
    return train(options())


def test_ddp_two_workers_match_each_other_and_one_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, single_worker_run: Any
) -> None:
    ranks = run_two_ranks(tmp_path, monkeypatch, fsdp=False)
    assert_params_close(ranks[0]["params"], ranks[1]["params"], atol=0)
    assert ranks[0]["history"] == ranks[1]["history"]
    # The sampler deals one permutation out to the ranks, so each step sees the same 32
    # samples as one worker: only the order of float additions differs.
    history, params = single_worker_run
    np.testing.assert_allclose(ranks[0]["history"], history, rtol=1e-4, atol=1e-6)
    assert_params_close(ranks[0]["params"], params, atol=1e-4)


def test_fsdp_two_workers_train_and_converge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, single_worker_run: Any
) -> None:
    ranks = run_two_ranks(tmp_path, monkeypatch, fsdp=True)
    history = ranks[0]["history"]
    assert history == ranks[1]["history"]
    assert sum(history[-8:]) / 8 < 0.008
    assert_params_close(ranks[0]["params"], ranks[1]["params"], atol=0)
    np.testing.assert_allclose(history, single_worker_run[0], rtol=1e-4, atol=1e-6)
    assert_params_close(ranks[0]["params"], single_worker_run[1], atol=1e-4)


# -- 3. gradient accumulation -------------------------------------------------------------------


def test_accumulating_four_micro_batches_of_8_equals_one_batch_of_32(
    single_worker_run: Any,
) -> None:
    history, params = train(options(micro_batch_size=8, gradient_accumulation=4))
    assert len(history) == len(single_worker_run[0])
    np.testing.assert_allclose(history, single_worker_run[0], rtol=1e-5, atol=1e-7)
    assert_params_close(params, single_worker_run[1], atol=1e-5)


def test_a_partial_last_group_is_averaged_over_its_own_micro_batches() -> None:
    # 256 / 32 = 8 micro-batches per epoch in groups of 3: 3, 3, 2
    history, _ = train(options(gradient_accumulation=3, epochs=1))
    assert len(history) == 3


# -- 4. precision -------------------------------------------------------------------------------


def test_bf16_autocast_runs_on_cpu_and_converges(single_worker_run: Any) -> None:
    trainer = Trainer(mlp, mse, regression, options=options(precision="bf16"), env=WorkerEnv())
    history = trainer.fit()
    assert trainer.state.precision.mode == "bf16" and trainer.state.precision.note is None
    assert sum(history[-8:]) / 8 < 0.008
    assert history != single_worker_run[0]  # it really ran in bf16


def test_fp16_on_cpu_falls_back_to_fp32_with_a_note(single_worker_run: Any) -> None:
    trainer = Trainer(mlp, mse, regression, options=options(precision="fp16"), env=WorkerEnv())
    history = trainer.fit()
    precision = trainer.state.precision
    assert (precision.requested, precision.mode, precision.scaler) == ("fp16", "fp32", None)
    assert precision.note is not None and "fp16 requested on cpu" in precision.note
    assert history == single_worker_run[0]


def test_precision_resolution_table() -> None:
    cpu = torch.device("cpu")
    assert resolve_precision("fp32", cpu) == ("fp32", None)
    assert resolve_precision("bf16", cpu) == ("bf16", None)
    assert resolve_precision("fp16", cpu)[0] == "fp32"
    with pytest.raises(ConfigError, match="unknown precision 'fp8'"):
        resolve_precision("fp8", cpu)
    assert Precision("bf16", cpu).loss_scale == 1.0
    assert Precision("bf16", cpu).state_dict() == {}


# -- 6. activation checkpointing ----------------------------------------------------------------


class Block(nn.Module):
    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Block.calls += 1
        return x + self.inner(x)


def blocks_model(mark: bool = False) -> nn.Module:
    block = Block()
    return nn.Sequential(checkpoint_activations(block) if mark else block, nn.Linear(8, 1))


@pytest.mark.parametrize("how", ["option", "mark"])
def test_activation_checkpointing_recomputes_and_gives_the_same_losses(how: str) -> None:
    def run(selectors: tuple[Any, ...], mark: bool) -> tuple[list[float], int]:
        Block.calls = 0
        opts = options(epochs=2, checkpoint_modules=selectors)
        trainer = Trainer(
            lambda: blocks_model(mark), mse, regression, options=opts, env=WorkerEnv()
        )
        history = trainer.fit()
        assert next(iter(trainer.state.module.state_dict())) == "0.inner.0.weight"
        return history, Block.calls

    plain, plain_calls = run((), False)
    checkpointed, calls = run(("Block",) if how == "option" else (), how == "mark")
    assert plain_calls == len(plain) and calls == 2 * len(plain)  # forward, then again in backward
    np.testing.assert_allclose(checkpointed, plain, rtol=1e-6)  # dropout masks replayed exactly


def test_checkpoint_modules_that_match_nothing_are_refused() -> None:
    trainer = Trainer(mlp, mse, regression, options=options(checkpoint_modules=("Nope",)),
                      env=WorkerEnv())  # fmt: skip
    with pytest.raises(ConfigError, match="matches no module"):
        trainer.fit()


# -- 7. stopping on SIGTERM, and the checkpoint hook --------------------------------------------


class MemoryCheckpoint:
    """A checkpoint hook keeping what a real one writes to disk: enough for an exact resume."""

    def __init__(self) -> None:
        self.saves: list[tuple[SaveReason, int]] = []
        self.saved: dict[str, Any] | None = None

    def save(self, state: TrainState, reason: SaveReason) -> None:
        self.saves.append((reason, state.step))
        self.saved = copy.deepcopy(
            {
                "model": state.module.state_dict(),
                "optimizer": state.optimizer.state_dict(),
                "precision": state.precision.state_dict(),
                "rng": capture_rng_state(),
                "position": (state.step, state.epoch, state.batch_in_epoch),
                "history": state.history,
            }
        )

    def restore(self, state: TrainState) -> bool:
        if self.saved is None:
            return False
        state.module.load_state_dict(self.saved["model"])
        state.optimizer.load_state_dict(self.saved["optimizer"])
        state.precision.load_state_dict(self.saved["precision"])
        restore_rng_state(self.saved["rng"])
        state.step, state.epoch, state.batch_in_epoch = self.saved["position"]
        state.history = list(self.saved["history"])
        return True


def test_sigterm_stops_at_the_next_step_boundary_and_checkpoints_once() -> None:
    hook = MemoryCheckpoint()

    def on_step(metrics: StepMetrics) -> None:
        if metrics.step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal, handled by the trainer

    previous = signal.getsignal(signal.SIGTERM)
    trainer = Trainer(mlp, mse, regression, options=options(), env=WorkerEnv(),
                      hooks=Hooks(checkpoint=hook), callbacks=[on_step])  # fmt: skip
    history = trainer.fit()
    # Step 3's boundary was agreed before its callbacks ran: the stop lands at step 4's.
    assert len(history) == 4 and trainer.stopped
    assert hook.saves == [("stop", 4)]
    assert signal.getsignal(signal.SIGTERM) is previous


def test_sigterm_to_the_process_group_stops_a_worker_with_loader_processes(
    tmp_path: Path,
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import torch
            from torch.utils.data import TensorDataset
            from gantry.training.trainer import Hooks, Trainer, TrainingOptions, WorkerEnv

            class Hook:
                def save(self, state, reason):
                    print(f"saved {reason} {state.step}", flush=True)
                def restore(self, state):
                    return False

            def data():
                return TensorDataset(torch.randn(256, 8), torch.randn(256, 1))

            trainer = Trainer(
                lambda: torch.nn.Linear(8, 1), torch.nn.functional.mse_loss, data,
                options=TrainingOptions(
                    micro_batch_size=32, epochs=100_000, num_workers=2, device="cpu"
                ),
                env=WorkerEnv(), hooks=Hooks(checkpoint=Hook()),
                callbacks=[lambda m: print(f"step {m.step}", flush=True)],
            )
            history = trainer.fit()
            print(f"done {len(history)} stopped={trainer.stopped}", flush=True)
            """
        )
    )
    worker = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as the node agent runs workers
    )
    try:
        assert worker.stdout is not None
        for line in worker.stdout:
            if line.startswith("step 5"):
                os.killpg(worker.pid, signal.SIGTERM)
                break
        out, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
    assert worker.returncode == 0, err
    saves = [line for line in out.splitlines() if line.startswith("saved")]
    done = out.splitlines()[-1]
    assert len(saves) == 1 and saves[0].startswith("saved stop")
    steps = int(saves[0].split()[-1])
    assert done == f"done {steps} stopped=True"
    assert steps < 8 * 100_000


def test_request_stop_without_a_checkpoint_hook_just_stops() -> None:
    trainer: Trainer | None = None

    def on_step(metrics: StepMetrics) -> None:
        assert trainer is not None
        trainer.request_stop()

    trainer = Trainer(mlp, mse, regression, options=options(), env=WorkerEnv(),
                      callbacks=[on_step])  # fmt: skip
    assert len(trainer.fit()) == 2 and trainer.stopped


def test_interval_checkpoints_are_saved_at_step_boundaries() -> None:
    hook = MemoryCheckpoint()
    opts = options(epochs=1, checkpoint_interval_s=1e-9)  # due at every step
    train(opts, hooks=Hooks(checkpoint=hook))
    assert hook.saves == [("interval", step) for step in range(1, SAMPLES // 32 + 1)]


def test_a_run_stopped_mid_epoch_resumes_exactly_from_its_checkpoint() -> None:
    opts = options(micro_batch_size=16, gradient_accumulation=2, epochs=3)
    uninterrupted, params = train(opts)
    hook = MemoryCheckpoint()
    first = Trainer(mlp, mse, regression, options=opts, env=WorkerEnv(),
                    hooks=Hooks(checkpoint=hook),
                    callbacks=[lambda m: m.step == 11 and first.request_stop()])  # fmt: skip
    assert len(first.fit()) == 12  # epoch 1, after micro-batch 8 of 16
    resumed = Trainer(mlp, mse, regression, options=opts, env=WorkerEnv(resume=True),
                      hooks=Hooks(checkpoint=hook))  # fmt: skip
    assert resumed.fit() == uninterrupted
    assert_params_close(resumed.state.module.state_dict(), params, atol=0)


# -- configuration ------------------------------------------------------------------------------


def test_worker_env_from_the_agent_environment(tmp_path: Path) -> None:
    env = WorkerEnv.from_environ(
        {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.5",
         "MASTER_PORT": "29500", "GANTRY_JOB_ID": "j-1", "GANTRY_CHECKPOINT_DIR": str(tmp_path),
         "GANTRY_RESUME": "1"}
    )  # fmt: skip
    assert (env.rank, env.world_size, env.local_rank, env.job_id) == (1, 4, 1, "j-1")
    assert env.checkpoint_dir == tmp_path and env.resume
    assert env.rendezvous() == "tcp://10.0.0.5:29500"
    assert WorkerEnv.from_environ({}) == WorkerEnv()
    with pytest.raises(ConfigError, match="RANK='x' is not an integer"):
        WorkerEnv.from_environ({"RANK": "x"})
    with pytest.raises(ConfigError, match="rank 4 is not within a world of 4"):
        WorkerEnv(rank=4, world_size=4)
    with pytest.raises(ConfigError, match="needs MASTER_ADDR and MASTER_PORT"):
        WorkerEnv(rank=0, world_size=2).rendezvous()


def test_options_from_the_spec_and_their_validation() -> None:
    spec = Training.model_validate(
        {"precision": "bf16", "gradientAccumulation": 4, "checkpointInterval": "15m"}
    )
    opts = TrainingOptions.from_spec(spec, micro_batch_size=8)
    assert (opts.precision, opts.gradient_accumulation, opts.checkpoint_interval_s) == (
        "bf16", 4, 900)  # fmt: skip
    assert opts.micro_batch_size == 8
    with pytest.raises(ConfigError, match="micro_batch_size must be positive"):
        TrainingOptions(micro_batch_size=0)
    with pytest.raises(ConfigError, match="unknown augmentation 'audio'"):
        TrainingOptions(augment={"audio": {}})


def test_features_the_spec_asks_for_need_their_hooks() -> None:
    with pytest.raises(ConfigError, match="no privacy hook"):
        Trainer(mlp, mse, regression, options=options(privacy=Privacy(epsilon=1.0)),
                env=WorkerEnv())  # fmt: skip
    with pytest.raises(ConfigError, match="fp16 gradient compression"):
        Trainer(mlp, mse, regression, options=options(compression="fp16"),
                env=WorkerEnv(world_size=2, init_method="file:///unused"))  # fmt: skip
    # one worker has no gradients to exchange: compression is moot, not an error
    Trainer(mlp, mse, regression, options=options(compression="fp16"), env=WorkerEnv())


def test_a_dataset_too_small_for_one_micro_batch_is_refused() -> None:
    trainer = Trainer(mlp, mse, regression, options=options(micro_batch_size=512),
                      env=WorkerEnv())  # fmt: skip
    with pytest.raises(Exception, match="not one micro-batch of 512"):
        trainer.fit()


# -- seeding ------------------------------------------------------------------------------------


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path: Path) -> None:
    seed_everything(7)
    state = capture_rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(3)  # move every generator on
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert again[:2] == expected[:2] and torch.equal(again[2], expected[2])


def test_deterministic_mode_is_switched_on_by_the_option() -> None:
    try:
        train(options(deterministic=True, max_steps=2))
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        set_deterministic(False)
    assert not torch.are_deterministic_algorithms_enabled()


def test_derived_seeds_are_stable_and_distinct() -> None:
    assert derive_seed(0, "rank", 1) == derive_seed(0, "rank", 1)
    assert len({derive_seed(0, "rank", r) for r in range(100)}) == 100
    assert 0 <= derive_seed(2**40, "x") < 2**63


def test_the_eta_counts_from_the_runs_step_after_a_resume() -> None:
    from gantry.training.trainer import _StepClock

    clock = _StepClock(total_steps=330)
    clock.tick(64, 320)  # a resumed run's first step: a warm-up, no rate yet
    _, eta = clock.tick(64, 321)
    assert eta is not None and eta < 9 * 1.0  # 9 steps left, each far under a second here
    _, eta = clock.tick(64, 330)
    assert eta == 0


# -- 9. evaluation during training (eval_every) -------------------------------------------------


def dropout_mlp() -> nn.Module:
    # dropout draws from the global generator every step: an evaluation that drew from it too
    # and did not put it back would change the training
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 1))


def mse_of(module: nn.Module) -> float:
    x, y = regression().tensors
    with torch.no_grad():
        return float(mse(module(x), y))


class Evaluations:
    """An evaluate function that records how it was called, and a callback that keeps what the
    trainer reports."""

    def __init__(self) -> None:
        self.calls: list[tuple[nn.Module, bool, bool]] = []  # module, training, grad enabled
        self.values: list[float] = []  # the mse each call returned
        self.reported: list[EpochEvaluation] = []

    def evaluate(self, module: nn.Module) -> dict[str, Any]:
        self.calls.append((module, module.training, torch.is_grad_enabled()))
        torch.rand(3)  # a draw from the training's generator
        self.values.append(mse_of(module))
        return {"mse": self.values[-1], "skipped": math.nan, "label": "not a number"}


def test_eval_every_evaluates_after_each_epoch_on_rank_0_without_changing_the_training() -> None:
    ev = Evaluations()
    opts = options(epochs=3, eval_every=1)
    trainer = Trainer(dropout_mlp, mse, regression, options=opts, env=WorkerEnv(),
                      evaluate=ev.evaluate, evaluation_callbacks=[ev.reported.append])  # fmt: skip
    history = trainer.fit()
    plain = Trainer(dropout_mlp, mse, regression, options=options(epochs=3), env=WorkerEnv())

    per_epoch = SAMPLES // 32
    assert [(e.epoch, e.step) for e in ev.reported] == [(1, 8), (2, 16), (3, 24)]
    assert [e.metrics["mse"] for e in ev.reported] == ev.values
    assert ev.reported[0].metrics["mse"] > ev.reported[-1].metrics["mse"]  # it learns
    # the last one evaluated the model as the run left it: after epoch 3, in eval mode
    assert ev.reported[-1].metrics["mse"] == mse_of(trainer.state.module.eval())
    assert all(m is trainer.state.module and not training and not grad
               for m, training, grad in ev.calls)  # fmt: skip
    assert trainer.state.module.training is False  # put in eval mode above, by the test
    assert history == plain.fit()  # bit for bit: the evaluations changed nothing
    assert len(history) == 3 * per_epoch


def test_eval_every_skips_epochs_and_a_run_ended_mid_epoch_is_not_evaluated_there() -> None:
    def run(ev: Evaluations, stop_after: int = 0, **changes: Any) -> Trainer:
        trainer = Trainer(
            mlp,
            mse,
            regression,
            options=options(**changes),
            env=WorkerEnv(),
            evaluate=ev.evaluate,
            evaluation_callbacks=[ev.reported.append],
            # a stop asked for in step 7 is agreed on in step 8, the epoch's last
            callbacks=[lambda m: m.step == stop_after and stop()],
        )
        stop = trainer.request_stop
        trainer.fit()
        return trainer

    every_2, cut, stopped = Evaluations(), Evaluations(), Evaluations()
    run(every_2, epochs=5, eval_every=2)
    run(cut, epochs=3, max_steps=20, eval_every=1)  # two epochs of 8 steps, then 4 of the third
    trainer = run(stopped, stop_after=7, epochs=3, eval_every=1)

    assert [(e.epoch, e.step) for e in every_2.reported] == [(2, 16), (4, 32)]
    assert [(e.epoch, e.step) for e in cut.reported] == [(1, 8), (2, 16)]
    assert trainer.stopped and trainer.state.step == 8 and not stopped.calls  # stop: no delay
    with pytest.raises(ConfigError, match="eval_every must not be negative"):
        options(eval_every=-1)


def test_evaluation_records_go_through_the_progress_pipe(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    printed = io.StringIO()
    reporter = ProgressReporter(fd=write_end, out=printed)
    ev = Evaluations()
    trainer = Trainer(mlp, mse, regression, options=options(epochs=2, eval_every=1),
                      env=WorkerEnv(), callbacks=[reporter], evaluate=ev.evaluate,
                      evaluation_callbacks=[reporter.evaluated])  # fmt: skip
    trainer.fit()
    reporter.close()
    with os.fdopen(read_end) as pipe:
        records = [json.loads(line) for line in pipe]

    evaluations = [r for r in records if r["kind"] == "evaluation"]
    assert evaluations == [  # only the finite numbers
        {"kind": "evaluation", "step": 8, "epoch": 1, "metrics": {"mse": ev.values[0]}},
        {"kind": "evaluation", "step": 16, "epoch": 2, "metrics": {"mse": ev.values[1]}},
    ]
    lines = [ln for ln in printed.getvalue().splitlines() if ln.startswith("eval ")]
    assert lines == [
        f"eval epoch {e}: mse={v:.4g} (not finite numbers: label, skipped)"
        for e, v in zip((1, 2), ev.values, strict=True)
    ]


def _evaluating_rank_main(rank: int, store: str, out: str, fsdp: bool, micro: int) -> None:
    warnings.simplefilter("error")
    torch.set_num_threads(1)
    env = WorkerEnv(rank=rank, world_size=2, init_method=f"file://{store}")
    evaluations: list[EpochEvaluation] = []
    steps: list[StepMetrics] = []

    def slow_evaluate(module: nn.Module) -> dict[str, float]:
        time.sleep(0.4)  # the other rank must wait for it in its next all-reduce, not hang
        return {"wrapped": float(isinstance(module, DistributedDataParallel))}

    opts = options(fsdp=fsdp, micro_batch_size=micro, epochs=2, eval_every=1)
    with Trainer(
        mlp,
        mse,
        regression,
        options=opts,
        env=env,
        callbacks=[steps.append],
        evaluate=slow_evaluate,
        evaluation_callbacks=[evaluations.append],
    ) as trainer:
        history = trainer.fit()
    result = {
        "history": history,
        "evaluations": [(e.epoch, e.step, e.metrics) for e in evaluations],
        "step_s": {m.step: m.step_s for m in steps},
    }
    torch.save(result, f"{out}/rank{rank}.pt")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_rank_0_evaluates_alone_and_the_other_rank_waits_in_its_next_all_reduce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsdp: bool
) -> None:
    ranks = run_two_ranks(tmp_path, monkeypatch, fsdp=fsdp, main=_evaluating_rank_main)

    assert ranks[0]["history"] == ranks[1]["history"] and len(ranks[0]["history"]) == 16
    assert ranks[1]["evaluations"] == []  # only rank 0 evaluates
    if fsdp:  # a sharded model is evaluated only once training is done (by the runtime)
        assert ranks[0]["evaluations"] == []
        return
    assert ranks[0]["evaluations"] == [(1, 8, {"wrapped": 0.0}), (2, 16, {"wrapped": 0.0})]
    # the first step after an evaluation: rank 1 waited there for rank 0's 0.4 s
    assert ranks[1]["step_s"][9] > 0.25
