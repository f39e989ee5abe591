"""Norm tracking during training: how far the image tokens' norm is from the text tokens' at the LLM input.

Logged through the Trainer's own ``logs`` (so TensorBoard, W&B, trackio and ``trainer_state.json`` get them with no
extra setup), every logging step:

    norm/projector_output_norm   mean L2 norm of the projected image tokens (the LLM's image inputs), averaged over
                                 the logging window: the blog's projector-norm-over-training curve
    norm/text_embedding_norm     T, mean L2 norm of the non-zero text-embedding rows (paper §5.1)
    norm/vision_text_ratio       the two above divided: 1 is the paper's alignment (Fig. 4 (a) at the input)
    norm/gain_abs_mean           mean |g| of the projector norm's gain            (paper Table 5)
    norm/gain_l2                 ||g||_2                                          (paper Table 5)
    norm/bias_abs_mean           mean |b|                                         (paper Table 5)
    norm/gain_grad_abs_mean      mean |dL/dg| at the optimizer step, AFTER gradient clipping (``max_grad_norm``):
                                 GWC multiplies the gradients below the norm by 1 / mean|g| (sqrt(D) / T at a
                                 target init: about 47 in the demo), so clipping is often active. ``train_stage``
                                 also logs the pre-clip gradient norm of each part, ``grad_norm/<part>``
                                 (``part_gradient_norms``)
    norm/gwc_factor              1 / clamp(mean |g|, delta), the GWC factor       (paper §5.1; only with GWC on)
    norm/clip_coef               min(1, max_grad_norm / grad_norm): the factor the Trainer's global gradient clipping
                                 multiplied every gradient by at the logged step (``grad_norm`` is the Trainer's
                                 pre-clip total; 1.0 when clipping is off)
    norm/update_size/<part>      ||delta theta|| / ||theta|| of each part (``vision_tower``, ``projector``,
                                 ``projector_norm``, ``llm``) over the logged optimizer step: how far the step moved it,
                                 whatever the optimizer did with the gradient (``update_sizes=False`` turns it off;
                                 it holds a copy of the trainable parameters during that one step)

On a stock LLaVA (or the "w/o Norm" variant) only the first three are logged: the gain and GWC fields are absent.

The projector's output (its norm's, where it has one: that is what the LLM receives, also in a model ``align``
wrote) is read by a forward hook that keeps a running sum on the device (no extra forward pass,
no host sync until a log). Only training forwards are counted: the module in training mode AND gradients enabled.
That leaves out evaluation (eval mode), and the forwards preference and RL trainers run under ``torch.no_grad()``
with the model still in training mode: GRPO's generation and its old/reference log-probabilities, DPO's reference
log-probabilities (whether from a separate reference model, whose modules are not hooked, or from the policy with
its adapter off); the gain's gradient is read once per logging step, before the optimizer step. At the
end (and at every checkpoint) the records are rebuilt from ``state.log_history`` and written as
``norm_tracking.json`` (a JSON list of records ``{"step", "epoch", <metric>: value}``; record step 0 holds the
values before any update). A resumed run therefore keeps the history of the interrupted one.

Also here: ``SigtermCheckpoint``, what ``train`` does when a scheduler sends SIGTERM before it preempts the job
(SLURM, Kubernetes): a checkpoint at the end of the optimizer step, then exit code 143.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import multiprocessing
import os
import signal
import threading

import torch
from transformers import TrainerCallback

from llava_normaligned.atomic_files import write_json_atomic
from llava_normaligned.compat import put_callback_first
from llava_normaligned.families.anatomy import anatomy_of, projector_norm_of, projector_of
from llava_normaligned.part_metrics import (
    clip_coefficient,
    gain_statistics,
    part_parameters,
    text_embedding_norm,
    update_sizes,
    whole_tensor,
)

logger = logging.getLogger(__name__)

PREFIX = "norm/"
NORM_TRACKING_FILE = "norm_tracking.json"
TABLE5_KEYS = ("gain_abs_mean", "gain_l2", "bias_abs_mean", "gwc_factor")  # logged every step (paper Table 5)


def will_log(args, state) -> bool:
    """Whether the optimizer step now running (``state.global_step + 1``) ends with a log."""
    step = state.global_step + 1
    if args.logging_strategy != "steps":
        return True
    every = state.logging_steps or 1
    return step % math.ceil(every) == 0 or (step == 1 and args.logging_first_step)


class NormTrackingCallback(TrainerCallback):
    """Logs the norm statistics above through the Trainer's loggers and writes ``norm_tracking.json``.

    A public callback for any transformers ``Trainer`` and TRL trainer (SFT, DPO, GRPO, KTO, ...):
    ``Trainer(..., callbacks=[NormTrackingCallback()])``, ``trainer.add_callback(NormTrackingCallback())`` or
    ``NormTrackingCallback.install(trainer)``. Its values must be in the ``logs`` the reporting callbacks
    (TensorBoard, W&B, trackio, ...) receive, and the Trainer puts those before every callback a user gives; so at its
    first events (``on_init_end``, ``on_train_begin``) it moves itself to the front of the handler's list
    (``compat.put_callback_first``), and ``install`` puts it there at once.
    ``output_dir``: where the final ``norm_tracking.json`` goes (default: the run's ``output_dir``).
    ``batches_counted``: the training forwards whose projector output was measured, over the whole run.
    """

    def __init__(self, output_dir: str | None = None, update_sizes: bool = True):
        self.output_dir = output_dir
        self.track_update_sizes = update_sizes
        self._before_step = None  # {part: [(copy, param)]} during a logged optimizer step
        self._update_sizes = None
        self._sum = None  # running sum of per-batch mean token norms (0-d tensor, on the model's device)
        self._batches = 0
        self.batches_counted = 0
        self._grad_abs_mean = None
        self._hook = None
        self._model = None
        self._text_norm_cache = None
        self._initial = None
        self._initial_text_norm = None
        # False: ``on_train_end`` writes no norm_tracking.json in the output folder (a run SIGTERM stopped: its
        # checkpoint holds the records, and the folder must not look like a finished run's; ``SigtermCheckpoint``)
        self.write_at_end = True

    @classmethod
    def install(cls, trainer, output_dir: str | None = None, update_sizes: bool = True) -> NormTrackingCallback:
        callback = cls(output_dir, update_sizes=update_sizes)
        trainer.callback_handler.callbacks.insert(0, callback)
        return callback

    # ---------------------------------------------------------------------------------------- measurements
    def _on_projector_output(self, module, inputs, output):
        if not (module.training and torch.is_grad_enabled()):  # a training forward (module docstring)
            return
        tokens = output.detach()
        mean_norm = tokens.float().norm(dim=-1).mean()  # over (B, N) image tokens
        self._sum = mean_norm if self._sum is None else self._sum + mean_norm
        self._batches += 1
        self.batches_counted += 1

    def _text_norm(self, model) -> float:
        # Frozen embeddings (stage 1, LoRA) keep T: compute it once. Trained ones change it: recompute per log.
        trained = anatomy_of(model).input_embeddings.weight.requires_grad
        if self._text_norm_cache is None or trained:
            self._text_norm_cache = text_embedding_norm(model)
        return self._text_norm_cache

    def _window_values(self) -> dict:
        values = {}
        if self._batches:
            values["projector_output_norm"] = float(self._sum) / self._batches
            values["text_embedding_norm"] = self._text_norm(self._model)
            values["vision_text_ratio"] = values["projector_output_norm"] / values["text_embedding_norm"]
        self._sum, self._batches = None, 0
        stats = gain_statistics(self._model)
        for key in TABLE5_KEYS:
            if key in stats:
                values[key] = stats[key]
        if self._grad_abs_mean is not None:
            values["gain_grad_abs_mean"] = self._grad_abs_mean
            self._grad_abs_mean = None
        return values

    # -------------------------------------------------------------------------------------------- events
    def _run_first(self) -> None:
        if not put_callback_first(self):
            logger.warning("NormTrackingCallback: called outside a Trainer's callback handler; its values reach the "
                           "reporting callbacks only if it runs before them")

    def on_init_end(self, args, state, control, **kwargs):
        self._run_first()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._run_first()  # again: a callback added after the Trainer was made meets its first event here
        self._model = model
        # what the LLM receives at the image positions: the norm's output where the model has one (an aligned LLaVA-NeXT
        # or OneVision applies it after its projector, to the image features), else the projector's
        watched = projector_norm_of(model) or projector_of(model)
        self._hook = watched.register_forward_hook(self._on_projector_output)
        if state.global_step == 0:
            self._initial = {k: v for k, v in gain_statistics(model).items() if k in TABLE5_KEYS}
            self._initial_text_norm = text_embedding_norm(model)  # T before the first update changes it

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if not will_log(args, state):
            return
        norm = projector_norm_of(self._model)
        grad = None if norm is None else norm.weight.grad
        if grad is not None and grad.numel():
            self._grad_abs_mean = float(whole_tensor(grad.detach()).float().abs().mean())
        if self.track_update_sizes:  # after clipping, before the step: keep what the step is about to change
            self._before_step = {
                part: [(whole_tensor(p.detach()).clone(), p) for _, p in params if p.requires_grad]
                for part, params in part_parameters(self._model).items()
            }
            self._before_step = {part: pairs for part, pairs in self._before_step.items() if pairs}

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self._before_step is not None:
            self._update_sizes = update_sizes(self._before_step)
            self._before_step = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1 and self._initial is not None:
            # The first step's forward ran before any update: its projector norm is the starting value.
            record = {"step": 0, "epoch": 0.0}
            if self._batches:
                record[PREFIX + "projector_output_norm"] = float(self._sum) / self._batches
                record[PREFIX + "text_embedding_norm"] = self._initial_text_norm
                record[PREFIX + "vision_text_ratio"] = (record[PREFIX + "projector_output_norm"]
                                                        / record[PREFIX + "text_embedding_norm"])
            record.update({PREFIX + k: v for k, v in self._initial.items()})
            state.log_history.insert(0, record)
            self._initial = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or self._model is None:
            return  # evaluation and end-of-training summaries carry no norm window
        values = {PREFIX + k: v for k, v in self._window_values().items()}
        if "grad_norm" in logs:  # the Trainer's pre-clip total norm of the logged step
            values[PREFIX + "clip_coef"] = clip_coefficient(logs["grad_norm"], args.max_grad_norm)
        if self._update_sizes is not None:
            values.update({f"{PREFIX}update_size/{part}": v for part, v in self._update_sizes.items()})
            self._update_sizes = None
        logs.update(values)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(values)  # the Trainer copied `logs` into the history before this call

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(folder):
                write_norm_tracking(norm_records(state.log_history), folder)

    def on_train_end(self, args, state, control, **kwargs):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if state.is_world_process_zero and self.write_at_end:
            write_norm_tracking(norm_records(state.log_history), self.output_dir or args.output_dir)


def norm_records(log_history: list[dict]) -> list[dict]:
    """The norm-tracking records of a Trainer's ``log_history``: ``{"step", "epoch", <metric>: value, ...}``."""
    records = []
    for entry in log_history:
        values = {k[len(PREFIX):]: v for k, v in entry.items() if k.startswith(PREFIX)}
        if values:
            record = {"step": entry.get("step"), "epoch": entry.get("epoch")}
            if "loss" in entry:
                record["loss"] = entry["loss"]
            # the Trainer's pre-clip total, and ``train_stage``'s per part (and its per-part clip factors), when logged
            record.update({k: v for k, v in entry.items()
                           if k == "grad_norm" or k.startswith(("grad_norm/", "clip_coef/"))})
            record.update(values)
            records.append(record)
    return records


def write_norm_tracking(records: list[dict], folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, NORM_TRACKING_FILE)
    return write_json_atomic(path, records, indent=1)


# ------------------------------------------------------------------------------------------- SIGTERM (preemption)


class Terminated(BaseException):
    """SIGTERM stopped the run (``SigtermCheckpoint``). Before training's loop the signal handler raises it where the
    main thread is (loading, data preparation: the run is abandoned, as Ctrl-C's ``KeyboardInterrupt`` does); in the
    loop ``run_stage`` raises it once the Trainer has saved the checkpoint of the step SIGTERM arrived in, instead of
    saving the final model. A ``BaseException``, as ``KeyboardInterrupt``: an ``except Exception`` on the way does
    not swallow it. ``checkpoint``: the folder of that checkpoint (None before the loop)."""

    def __init__(self, checkpoint: str | None = None):
        super().__init__("terminated (SIGTERM)" if checkpoint is None else f"terminated (SIGTERM); saved {checkpoint}")
        self.checkpoint = checkpoint


class SigtermCheckpoint(TrainerCallback):
    """SIGTERM, which SLURM and Kubernetes send before they preempt a job, ends a run the way Ctrl-C does before
    training's loop, and with a normal checkpoint once it runs.

    ``with callback.handling():`` installs the SIGTERM handler (in the main thread only: ``signal.signal`` cannot be
    called from another; elsewhere nothing is installed) and puts the previous handler back at the end of the block.
    The callback goes to the Trainer (``train_stage(..., callbacks=[callback])``; ``train`` does both).

    * Before ``on_train_begin`` (loading, data preparation, the Trainer's set-up): the handler raises ``Terminated``
      in the main thread, so the caller cleans up as for Ctrl-C (``train``: the output folder it created goes unless
      it holds a checkpoint; one line, exit code 143).
    * From ``on_train_begin`` on, the handler only sets a flag; nothing is interrupted mid-operation. At the end of
      the optimizer step then running, ``on_step_end`` sets ``control.should_save`` (the Trainer's own checkpoint,
      through its public save path: model, optimizer, scheduler, RNG states, ``trainer_state.json``, the
      norm-tracking records), ``control.should_log`` (the losses since the last log are kept in that checkpoint's
      history) and ``control.should_training_stop``. ``stopped_at`` is then that step, and ``run_stage`` raises
      ``Terminated(checkpoint)`` instead of saving the final model and ``training_summary.json`` as a finished run
      does; the callbacks given to ``hold_back`` (the norm tracking) write no end-of-run file either. A SIGTERM that
      arrives after the last step's ``on_step_end`` lets the run finish and save as usual. A second SIGTERM changes
      nothing: the scheduler's SIGKILL follows at the end of its grace period, so that period must cover one
      optimizer step and one checkpoint (Kubernetes ``terminationGracePeriodSeconds``, SLURM ``GraceTime`` for
      preemption or ``--signal=TERM@SECONDS`` before a time limit; ``torchrun`` forwards SIGTERM to its workers and
      kills them after ``--shutdown-timeout``, 30 s by default).
    * Under ``torch.distributed`` (DDP over gloo or NCCL, DeepSpeed, FSDP) every rank must stop at the same step (the
      checkpoint is a collective save; a rank that went on would wait for the others forever), and a scheduler may
      signal some ranks or signal them at different moments: ``on_step_end`` all-reduces the flag (max) on every
      step, one 4-byte all-reduce, so all ranks agree to stop at the first step any of them was signalled in.
    * DataLoader workers (``--dataloader_num_workers``) keep serving batches through a SIGTERM while training runs:
      torch's own worker handler dies of it, and the main process then fails ("DataLoader worker ... is killed by
      signal: Terminated") before the step ends, and SIGTERM does reach the workers where the signal goes to a
      process group (``torchrun`` signals each rank's group; SLURM signals every process of a job step). So
      ``on_train_begin`` wraps the loader's ``worker_init_fn`` (``_serve_through_sigterm``): a worker ignores SIGTERM
      until training ends (the main process then shuts its workers down as usual), and exits on one after that. A
      forked child that kept this handler (a data-preparation worker, ``--dataset_num_proc``) dies of SIGTERM as it
      would without it.

    Why not transformers' own ``TrainingArguments.enable_jit_checkpoint`` (``trainer_jit_checkpoint.py``, the same
    file in transformers 5.18, 5.24 and 5.25, so not a 5.25 novelty): its handler starts a 3 s timer before it asks
    for a checkpoint (to tell SIGTERM from a SIGKILL that follows at once: 3 s of the grace period lost); the first
    callback event after that saves through the Trainer's private ``_save_checkpoint``, mostly from
    ``on_pre_optimizer_step``, in the middle of a step (the weights of step N saved with the RNG state of step N+1's
    forward), and the loop then still runs that step's optimizer update and ends normally, so ``run_stage`` would
    write the final model and summary as if the run had finished; its handler is installed when the Trainer is
    built, after loading and data preparation, so a SIGTERM there has no clean-up; and it leaves the one-line report
    and the exit code to the caller. ``train`` (and ``train_stage``) therefore refuse ``enable_jit_checkpoint``
    (bad input, one line naming the flag) rather than run two SIGTERM handlers against each other.
    """

    def __init__(self):
        self.requested = False  # SIGTERM arrived
        self.training_started = False  # on_train_begin was reached: from here on the handler only sets the flag
        self.stopped_at: int | None = None  # the step whose end saved the checkpoint and stopped the run
        self._held_back: list = []
        self._pid = None  # the process that installed the handler
        self._release_workers = None  # shared with the DataLoader workers: 1 once they may die of SIGTERM

    def hold_back(self, *callbacks) -> None:
        """Callbacks (``NormTrackingCallback``) whose end-of-run file is not written when SIGTERM stopped the run."""
        self._held_back.extend(callbacks)

    @contextlib.contextmanager
    def handling(self):
        """Install the SIGTERM handler for the ``with`` block (main thread only), then restore the previous one."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._pid = os.getpid()
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._let_workers_go()
            self._pid = None

    def _on_sigterm(self, signum, frame) -> None:
        # no logging here: the main thread may be inside a logging call
        if os.getpid() != self._pid:  # a forked child (a data-preparation worker): SIGTERM's default, no traceback
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self.requested = True
        if not self.training_started:
            raise Terminated()

    def _agreed(self, args) -> bool:
        """The flag, the same on every rank: the max over the ranks under ``torch.distributed``."""
        stop = self.requested
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([int(stop)], dtype=torch.int32, device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item())
        return stop

    def _let_workers_go(self) -> None:
        if self._release_workers is not None:
            self._release_workers.value = 1

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.training_started = True
        if self._pid is None or not getattr(train_dataloader, "num_workers", 0):
            return  # no handler installed (SIGTERM ends the run anyway), or no workers
        if self._release_workers is None:
            self._release_workers = multiprocessing.RawValue("b", 0)
        self._release_workers.value = 0
        loader = train_dataloader
        while hasattr(loader, "base_dataloader"):  # accelerate's DataLoaderShard / Dispatcher wrap the torch loader
            loader = loader.base_dataloader
        init_fn = loader.worker_init_fn
        if not (isinstance(init_fn, functools.partial) and init_fn.func is _serve_through_sigterm):
            loader.worker_init_fn = functools.partial(_serve_through_sigterm, self._release_workers, init_fn)

    def on_train_end(self, args, state, control, **kwargs):
        self._let_workers_go()

    def on_step_end(self, args, state, control, **kwargs):
        if self.stopped_at is not None or not self._agreed(args):
            return
        self.stopped_at = state.global_step
        control.should_save = True
        control.should_log = True
        control.should_training_stop = True
        for callback in self._held_back:
            callback.write_at_end = False
        if state.is_world_process_zero:
            logger.warning("SIGTERM: saving checkpoint-%d at the end of this step, then stopping", state.global_step)


def _serve_through_sigterm(release, init_fn, worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn`` while ``SigtermCheckpoint`` runs (after torch set its own signal
    handlers): SIGTERM is ignored until ``release`` (shared memory) is 1, then ends the worker quietly, as torch's
    handler does for its parent's SIGTERM. Then the loader's own ``init_fn``."""

    def on_sigterm(signum, frame):
        if release.value:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    if init_fn is not None:
        init_fn(worker_id)


__all__ = [
    "NORM_TRACKING_FILE",
    "NormTrackingCallback",
    "SigtermCheckpoint",
    "Terminated",
    "norm_records",
    "will_log",
    "write_norm_tracking",
]
