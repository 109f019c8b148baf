"""The loss, as the workers' hook reads it (stdlib only, Python 3.8+): written into the run directory's `hook/` beside
`sitecustomize.py` (launcher/node/agent/stackdump.py `install_hook`), the part of the hook's `Recorder` that reads
each step's loss (launcher/node/worker/hook.py says what the record holds).

A `Tensor.backward` on a one-element tensor with no gradient is a loss; the step's value is the sum of its backwards'
(what a gradient-accumulating loop prints: each micro-batch's loss divided by their count), divided by the scale of
AMP's GradScaler when the tensor is the one `scale` returned. Read off the hot path: a CPU value at the step (no sync
to pay), a CUDA one copied at the step into a pinned ring (`non_blocking`, an event recorded) and read once its event
says it landed (at a flush or the end; never a sync); a step the GradScaler skipped (inf/nan gradients: `update` came
with no step since the last) is counted, its value dropped. A backward with a gradient, a device it does not read, or
any failure: no value, and the record says why (loss reading only stops).
"""

import math
import sys
import weakref


class LossReading:
    """The loss part of the hook's `Recorder` (its `steps`, `ring_size` and `clock` are the recorder's)."""

    def loss_reset(self):
        self.acc, self.acc_grad = None, False  # this step's losses summed (a tensor), a backward with a gradient seen
        self.scaled = None  # (weak reference, scale tensor): the tensor GradScaler.scale returned last
        self.stepped = False  # an optimizer step since GradScaler's last update
        self.ring, self.pending, self.slot = None, [], 0  # CUDA: pinned floats, (step, slot, event) in flight
        self.loss_step, self.loss, self.loss_sum, self.loss_n = 0, math.nan, 0.0, 0
        self.bad_step, self.bad, self.good_step, self.good, self.skipped = 0, math.nan, 0, math.nan, 0

    def loss_fields(self):
        """LOSS_STEP LOSS LOSS_SUM LOSS_N BAD_STEP BAD GOOD_STEP GOOD SKIPPED LOSS_STATE, as the record writes them
        (the CUDA values that have landed read first)."""
        if self.pending:
            self.resolve()
        return (
            self.loss_step,
            self.loss,
            self.loss_sum,
            self.loss_n,
            self.bad_step,
            self.bad,
            self.good_step,
            self.good,
            self.skipped,
            self.loss_state,
        )

    def add_loss(self, tensor, gradient):
        # Summed over the step's backwards: Lightning, HF Trainer and the usual accumulation loop divide each
        # micro-batch's loss by the number of micro-batches before its backward, so the sum is the mean they print.
        if gradient is not None or tensor.numel() != 1:
            self.acc_grad = True  # the step's loss is not the tensors': no value, never a guess
            self.loss_state = b"grad"
            if gradient is not None:
                self.loss_why = b"backward with a gradient"
            else:
                self.loss_why = b"backward on %d elements" % tensor.numel()
            return
        scaled = self.scaled
        scale = None
        if scaled is not None and scaled[0]() is tensor:  # GradScaler's: the loss times its scale
            scale, self.scaled = scaled[1], None
        if tensor.is_cpu:  # its value now, a float: no tensor made (a new one each step cost a tight loop 5%)
            value = tensor.item() if scale is None else tensor.item() / scale.item()  # item(): no warning, no tensor
        else:
            value = tensor.detach().float()  # device ops, queued: no sync
            if scale is not None:
                value = value / scale.to(value.device, non_blocking=True)  # the same device: itself
        self.acc = value if self.acc is None else self.acc + value

    def loss_of_step(self):
        """The step's value: a CPU one read at its backward, a CUDA one copied to the pinned ring and read once it
        has landed."""
        acc, grad = self.acc, self.acc_grad
        self.acc, self.acc_grad = None, False
        if acc is None or grad:
            return
        try:
            if isinstance(acc, float):
                self.value(self.steps, acc)
                return
            kind = acc.device.type
            if kind == "cuda":
                self.send(acc)
            else:
                self.loss_state, self.loss_why = b"device", b"loss on %s not read" % kind.encode("ascii", "replace")
        except Exception as exc:
            self.loss_off(exc)

    def send(self, acc):
        if not self.ring_size:
            self.loss_state, self.loss_why = b"device", b"loss on cuda not read (no ring)"
            return
        torch = sys.modules["torch"]  # imported by the program: the hook never imports it
        if self.ring is None:
            self.ring = torch.empty(self.ring_size, dtype=torch.float32, pin_memory=True)
        if len(self.pending) >= self.ring_size:
            self.resolve()
            if len(self.pending) >= self.ring_size:
                return  # every slot still in flight: this step has no value
        slot = self.slot
        self.slot = (slot + 1) % self.ring_size
        self.ring[slot].copy_(acc.reshape(()), non_blocking=True)  # a [1] or [1, 1] loss into a 0-dim slot
        event = torch.cuda.Event()
        event.record()
        self.pending.append((self.steps, slot, event))
        self.loss_state = b"on"

    def resolve(self):
        """The CUDA values that have landed (their event done, in the order of their steps): no sync."""
        try:
            while self.pending and self.pending[0][2].query():
                step, slot, _ = self.pending.pop(0)
                self.value(step, float(self.ring[slot]))
        except Exception as exc:
            self.loss_off(exc)

    def value(self, step, value):
        self.loss_step, self.loss, self.loss_state, self.loss_why = step, value, b"on", b""
        if math.isfinite(value):
            self.loss_sum += value
            self.loss_n += 1
            if not self.bad_step:
                self.good_step, self.good = step, value
        elif not self.bad_step:
            self.bad_step, self.bad = step, value

    def scale(self, scaler, outputs, scaled):
        """GradScaler.scale(outputs) returned `scaled`: a backward on it is the loss times the scaler's scale."""
        if self.loss_state == b"off" or scaled is outputs or getattr(scaler, "_scale", None) is None:
            return
        try:
            if isinstance(scaled, sys.modules["torch"].Tensor):
                self.scaled = (weakref.ref(scaled), scaler._scale)  # a weak one: no loss's graph kept alive
        except Exception as exc:
            self.loss_off(exc)

    def update(self):
        """GradScaler.update: with no optimizer step since the last one, the scaler skipped it (inf/nan gradients):
        counted, and the step's losses dropped."""
        if not self.stepped:
            self.skipped += 1
            self.acc, self.acc_grad = None, False
        self.stepped = False

    def loss_off(self, exc):
        """Loss reading stops for this process (the rest of its recording goes on), and the record says why."""
        self.loss_state = b"off"
        self.acc, self.scaled, self.pending = None, None, []
        why = "loss: %s: %s" % (type(exc).__name__, exc)
        self.loss_why = " ".join(why.split()).encode("utf-8", "replace")
