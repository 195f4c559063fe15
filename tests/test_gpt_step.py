"""Lesson 11's written-out training step (kernels/gpt_step.py) against torch's autograd and
AdamW: the loss, every gradient, and the weights after a few steps; its bad input; and the
bfloat16 arithmetic of the Triton interpreter it relies on in simulation."""
import pytest
import torch

import utils
from kernels.gpt_step import TrainStep

CFG = utils.GPTConfig(vocab_size=67, block_size=16, n_layer=2, n_head=2, n_embd=32)
B, T = 2, 12   # T < block_size: the rows of wpe past T get no gradient


def _batch(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, CFG.vocab_size, (B, T), generator=gen)
    y = torch.randint(0, CFG.vocab_size, (B, T), generator=gen)
    return x.to(utils.DEVICE), y.to(utils.DEVICE)


def _worst_grad_error(model, ref):
    """The largest error of a gradient, relative to that gradient's largest value."""
    worst = {}
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        scale = float(q.grad.abs().max()) or 1.0
        worst[name] = float((p.grad.double() - q.grad).abs().max()) / scale
    return max(worst.values()), worst


def _against_autograd(cfg, seed, **step_kw):
    """(loss difference, worst relative gradient error and each one's, the step, the model) of one
    forward + backward of the step against torch's autograd in float64, from the same weights."""
    ref = utils.GPT(cfg, "torch", seed=0).to(utils.DEVICE).double()
    model = utils.GPT(cfg, "torch", seed=0).to(utils.DEVICE)
    step = TrainStep(model, batch=B, T=T, clip=0.0, **step_kw)
    x, y = _batch(seed)
    with utils.race_checks_off():
        loss = step.forward(x, y)
        step.backward()
    _, ref_loss = ref(x, y)
    ref_loss.backward()
    worst, each = _worst_grad_error(model, ref)
    return abs(float(loss) - float(ref_loss.detach())), worst, each, step, model


@pytest.mark.parametrize("matmul", ["torch", "triton"])
def test_float32_step_gives_autograds_loss_and_gradients(matmul):
    cfg = CFG if matmul == "torch" else utils.GPTConfig(vocab_size=67, block_size=16, n_layer=1, n_head=2,
                                                          n_embd=32)
    loss_diff, worst, each, _, model = _against_autograd(cfg, 1, dtype=torch.float32, matmul=matmul)
    assert loss_diff < 1e-5
    assert worst < 1e-4, each
    # the positions past T got no gradient
    assert float(model.wpe.weight.grad[T:].abs().max()) == 0.0


def test_bfloat16_step_stays_near_autograd():
    loss_diff, worst, each, step, _ = _against_autograd(CFG, 2, dtype=torch.bfloat16)
    assert loss_diff < 0.02
    assert worst < 0.05, each          # bfloat16 activations: about 3 significant digits
    assert step.p16.dtype == torch.bfloat16 and step.logits.dtype == torch.bfloat16


def test_steps_follow_torch_adamw_with_clipping_and_warmup():
    ref = utils.GPT(CFG, "torch", seed=0).to(utils.DEVICE)
    model = utils.GPT(CFG, "torch", seed=0).to(utils.DEVICE)
    lr, warmup = 1e-2, 3
    opt = utils.make_optimizer(ref, lr=lr)
    step = TrainStep(model, batch=B, T=T, lr=lr, dtype=torch.float32, clip=1.0, warmup=warmup)
    with utils.race_checks_off():
        for s in range(4):
            x, y = _batch(10 + s)
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, (s + 1) / warmup)
            _, ref_loss = ref(x, y)
            opt.zero_grad()
            ref_loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
            opt.step()
            loss = step(x, y)
            assert abs(float(loss) - float(ref_loss.detach())) < 1e-4
    assert step.steps_taken == 4
    worst = max(float((p - q).detach().abs().max()) for p, q in zip(model.parameters(), ref.parameters()))
    assert worst < 1e-4
    # the model's parameters are the step's master weights: the model sees the update
    _, after = model(*_batch(20))
    _, ref_after = ref(*_batch(20))
    assert abs(float(after) - float(ref_after)) < 1e-4


def test_step_refuses_bad_batches_and_settings():
    model = utils.GPT(CFG, "torch", seed=0).to(utils.DEVICE)
    step = TrainStep(model, batch=B, T=T, dtype=torch.float32)
    x, y = _batch(3)
    with pytest.raises(ValueError, match=r"x must be a \(2, 12\) tensor"):
        step(x[:, :5].contiguous(), y)
    with pytest.raises(TypeError, match="y must be contiguous int64"):
        step(x, y.int())
    with pytest.raises(ValueError, match="T must be in 1..block_size"):
        TrainStep(model, batch=B, T=CFG.block_size + 1)
    with pytest.raises(ValueError, match="matmul must be one of"):
        TrainStep(model, batch=B, T=T, matmul="cublas")
    with pytest.raises(TypeError, match="dtype must be"):
        TrainStep(model, batch=B, T=T, dtype=torch.float16)


@pytest.mark.skipif(not utils.SIMULATE, reason="the interpreter's arithmetic (a GPU computes bfloat16 natively)")
def test_interpreter_computes_bfloat16_on_values_not_bits():
    import triton
    import triton.language as tl

    @triton.jit
    def ops_kernel(x_ptr, y_ptr, out_ptr, BLOCK: tl.constexpr):
        o = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + o)
        y = tl.load(y_ptr + o)
        tl.store(out_ptr + o, x + y)
        tl.store(out_ptr + BLOCK + o, x * y)
        tl.store(out_ptr + 2 * BLOCK + o, -x)
        tl.store(out_ptr + 3 * BLOCK + o, tl.where(x < y, x, y))
        tl.store(out_ptr + 4 * BLOCK + o, tl.zeros([BLOCK], tl.bfloat16) + tl.max(x, axis=0))

    x = torch.randn(32).bfloat16()
    y = torch.randn(32).bfloat16()
    out = torch.empty(5 * 32, dtype=torch.bfloat16)
    ops_kernel[(1,)](x, y, out, BLOCK=32)
    want = torch.cat([x + y, x * y, -x, torch.minimum(x, y), x.max().expand(32)])
    assert torch.equal(out, want)
