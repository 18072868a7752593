"""Stand-in training workers for scheduling tests: a script that counts steps into its
checkpoint directory and, resumed, says from where before finishing a few steps later."""

from __future__ import annotations


def counting_trainer(*, steps_after_resume: int = 3, step_s: float = 0.1) -> str:
    """A ``python -c`` script: counts steps into ``$GANTRY_CHECKPOINT_DIR/step`` until stopped
    (SIGTERM exits at once); with ``GANTRY_RESUME=1`` it reads the step back, prints
    ``resumed from step N`` and finishes ``steps_after_resume`` steps later."""
    return f"""
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
ckpt = pathlib.Path(os.environ["GANTRY_CHECKPOINT_DIR"])
step, last = 0, 10**6
if os.environ.get("GANTRY_RESUME") == "1":
    step = int((ckpt / "step").read_text())
    print(f"resumed from step {{step}}", flush=True)
    last = step + {steps_after_resume}
while step < last:
    step += 1
    tmp = ckpt / f"step.{{os.getpid()}}"
    tmp.write_text(str(step))
    tmp.replace(ckpt / "step")
    print(f"step {{step}}", flush=True)
    time.sleep({step_s})
"""


__all__ = ["counting_trainer"]
