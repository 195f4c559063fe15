"""Lesson 11's GPT on the course's kernels against the same GPT on torch's (in simulation, or on a GPU):

* the loss and every parameter's gradient after one forward and backward (float64, the course's
  LayerNorm, attention and GELU kernels; float32 with lesson 06's Triton matmul as well);
* the losses of 10 AdamW steps;
* a run resumed from a checkpoint gives the same losses as the run that went on;
* the H100 benchmark script runs two steps of a tiny config on the CPU.

The model is tiny (2 layers, width 32, 2 heads, sequence 32 for the gradients) because Triton's
interpreter takes milliseconds per program; the training checks use sequences of 8."""
from __future__ import annotations

import json

import pytest
import torch

import utils

CFG = utils.GPTConfig(vocab_size=48, block_size=32, n_layer=2, n_head=2, n_embd=32)


@pytest.fixture(autouse=True)
def _fast():
    with utils.race_checks_off():
        yield


def test_gradients_match_torch_float64():
    rep = utils.gradient_check(CFG, backend="course", matmul="torch", dtype=torch.float64, batch=1, T=32)
    print(rep)
    assert len(rep.rows) == len(list(utils.GPT(CFG).parameters())) == 4 + 12 * CFG.n_layer
    # float64 rounds each sum to ~2^-53 of its terms, and the loss's sums run over every
    # parameter: their count times float64's epsilon bounds the relative difference that another
    # order of summation gives (a GPU's reduction trees and FMAs: 4.6e-12 measured on an H100,
    # under 1e-12 in simulation). 28,032 parameters: 6.2e-12 of the loss, where float32's
    # epsilon alone is 1.2e-7
    n_params = utils.GPT(CFG).num_params()
    assert rep.loss_diff < n_params * torch.finfo(torch.float64).eps * abs(rep.loss_ref)
    assert rep.ok, str(rep)
    # every gradient is nonzero: a check against a model that does nothing would pass too
    assert min(r[2] for r in rep.rows) > 0


def test_gradients_match_torch_float32_triton_matmul():
    rep = utils.gradient_check(CFG, backend="course", matmul="triton", dtype=torch.float32, batch=1, T=8)
    print(rep)
    assert rep.ok, str(rep)


def test_gradient_check_names_a_wrong_operator():
    # a GELU whose backward forgets the x (1 - t^2) term: the check must fail
    wrong = utils.ops_for("torch").replace(gelu=lambda x: _HalfGelu.apply(x))
    rep = utils.gradient_check(CFG, ops=wrong, dtype=torch.float64, batch=1, T=8)
    assert not rep.ok and rep.loss_diff < 1e-12    # the forward is right, the gradients are not


class _HalfGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.nn.functional.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        t = torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))
        return dy * 0.5 * (1 + t)


def _run(backend, steps, ck_at=None, ck_path=None, resume=None):
    torch.manual_seed(0)
    data = torch.arange(400) % 12                      # a pattern the model can learn in 10 steps
    model = utils.GPT(CFG, backend, seed=0).to(utils.DEVICE, torch.float64)  # the batches follow its device
    opt = utils.make_optimizer(model, lr=1e-2)
    gen = torch.Generator().manual_seed(7)
    losses = []
    if resume is not None:
        utils.load_checkpoint(resume, model, opt, gen)
    for step in range(steps):
        losses += utils.train_gpt(model, data, steps=1, batch=1, T=8, opt=opt, gen=gen)
        if ck_at is not None and step + 1 == ck_at:
            utils.save_checkpoint(ck_path, model, opt, gen, step + 1)
    return losses


def test_ten_adamw_steps_and_resume(tmp_path):
    ck = tmp_path / "ck.pt"
    course = _run("course", 10, ck_at=9, ck_path=ck)
    ref = _run("torch", 10)
    print("course", course)
    print("torch ", ref)
    assert course[-1] < course[0] - 0.05          # it learns
    diffs = [abs(a - b) for a, b in zip(course, ref)]
    # float64, but the attention backward keeps L in float32: gradients agree to ~3e-7 relative,
    # AdamW's steps to lr * 3e-7, the losses to ~1e-8 (they move by ~0.1 a step)
    assert max(diffs) < 1e-6, diffs
    resumed = _run("course", 1, resume=ck)
    assert resumed == course[9:], (resumed, course[9:])


def test_checkpoint_of_another_config_is_refused(tmp_path):
    m = utils.GPT(CFG)
    opt = utils.make_optimizer(m)
    utils.save_checkpoint(tmp_path / "a.pt", m, opt)
    other = utils.GPT(utils.GPTConfig(vocab_size=48, block_size=32, n_layer=1, n_head=2, n_embd=32))
    with pytest.raises(ValueError, match="config"):
        utils.load_checkpoint(tmp_path / "a.pt", other, utils.make_optimizer(other))


def test_bad_switches_and_configs():
    with pytest.raises(ValueError, match="backend"):
        utils.GPT(CFG, backend="cuda")
    with pytest.raises(ValueError, match="matmul"):
        utils.GPT(CFG, matmul="cublas")
    with pytest.raises(ValueError, match="multiple"):
        utils.GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="block_size"):
        utils.GPT(CFG)(torch.zeros(1, 33, dtype=torch.long))


def test_corpus_is_the_course_text():
    tok, train, val = utils.char_dataset(0.1)
    text = utils.course_text()
    assert "You will learn" in text and len(text) > 50_000
    assert tok.decode(tok.encode("kernel")) == "kernel"
    assert len(train) + len(val) == len(text)


def test_h100_script_runs_tiny_on_cpu(tmp_path, capsys):
    from benchmarks.lessons import gpt_train
    out = tmp_path / "res"
    gpt_train.main(["--tiny", "--steps", "2", "--out", str(out)])
    res = json.loads((out / "gpt-train.json").read_text())
    names = [c["name"] for c in res["configs"]]
    assert names == list(gpt_train.CONFIGS)
    assert names[:2] == ["torch eager", "torch.compile"] and names[-2:] == ["course + cuBLAS", "course + Triton matmul"]
    # the ablation swaps the course's kernels in one at a time, keeping the ones before
    swapped = [gpt_train.SETUP[n][0] for n in names[2:-2]]
    assert all(len(b) == len(a) + 1 and b[:-1] == a for a, b in zip(swapped, swapped[1:])), swapped
    for c in res["configs"]:
        assert "error" not in c, c.get("trace")
        assert len(c["losses"]) == 2 and all(v == v for v in c["losses"])
        assert c["profile"]["top"], c["profile"]
    # same weights and batches: the first loss is the same in every configuration
    first = [c["losses"][0] for c in res["configs"]]
    assert max(first) - min(first) < 1e-3, first
    assert set(res["agreement"]) == set(names[1:])
