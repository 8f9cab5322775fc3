"""FOOF: the input covariances against hand computations, the step against an explicit inverse, and conformance."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from fedhf.optim.base import ModelAccess
from fedhf.optim.foof import FOOF


def _access(model, batches, forward=None, loss=None):
    forward = forward or (lambda b: model(b["x"]))
    return ModelAccess(model=model, logits=forward, batches=lambda: iter(batches),
                       loss=loss or (lambda b: F.cross_entropy(forward(b), b["labels"])))


def _with_one(a):
    return torch.cat([a, torch.ones(a.shape[0], 1, dtype=a.dtype)], 1)


def _mean_outer(rows):
    return rows.T @ rows / rows.shape[0]


def _mlp(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.LayerNorm(5), torch.nn.Tanh(),
                                torch.nn.Linear(5, 3, bias=False)).double()
    x = torch.randn(20, 4, dtype=torch.float64)
    return model, x, [{"x": x[:10]}, {"x": x[10:]}]


def test_covariance_of_a_two_layer_mlp_is_the_mean_of_a_a_transpose():
    model, x, batches = _mlp()
    optimizer = FOOF(model.named_parameters(), lr=0.1)
    optimizer.attach(_access(model, batches))
    optimizer.before_forward(0, batches[0])
    assert optimizer.layers() == [("0.weight", "0.bias"), ("3.weight", None)]
    with torch.no_grad():
        hidden = torch.tanh(model[1](model[0](x)))
    A0, A3 = optimizer.state[model[0].weight]["A"], optimizer.state[model[3].weight]["A"]
    assert A0.dtype == torch.float32 and A0.shape == (5, 5) and A3.shape == (5, 5)
    torch.testing.assert_close(A0.double(), _mean_outer(_with_one(x)), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(A3.double(), _mean_outer(hidden), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("damping", [0.5, 0.0])
def test_step_is_gradient_times_damped_inverse_with_bias_as_homogeneous_coordinate(damping):
    model, _, batches = _mlp(1)
    lr, wd = 0.2, 0.01
    optimizer = FOOF(model.named_parameters(), lr=lr, damping=damping, weight_decay=wd)
    optimizer.attach(_access(model, batches))
    optimizer.before_forward(0, batches[0])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer.step()

    def inverse(weight):
        A = optimizer.state[weight]["A"].double()
        return torch.linalg.inv(A + damping * torch.eye(A.shape[0], dtype=torch.float64))

    # layer 0, with bias: [W | b] <- [W | b] - lr [G_W + wd W | G_b + wd b] (A + lambda I)^{-1}
    W_aug = torch.cat([before["0.weight"], before["0.bias"][:, None]], 1)
    G_aug = torch.cat([grads["0.weight"], grads["0.bias"][:, None]], 1) + wd * W_aug
    expected = W_aug - lr * G_aug @ inverse(model[0].weight)
    torch.testing.assert_close(model[0].weight.detach(), expected[:, :4], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model[0].bias.detach(), expected[:, 4], rtol=1e-12, atol=1e-12)
    # layer 3, without bias
    expected = before["3.weight"] - lr * (grads["3.weight"] + wd * before["3.weight"]) @ inverse(model[3].weight)
    torch.testing.assert_close(model[3].weight.detach(), expected, rtol=1e-12, atol=1e-12)
    # LayerNorm affine parameters: plain SGD with coupled weight decay
    for name in ("1.weight", "1.bias"):
        torch.testing.assert_close(dict(model.named_parameters())[name].detach(),
                                   before[name] - lr * (grads[name] + wd * before[name]), rtol=0, atol=1e-15)


class _LoraLinear(torch.nn.Module):
    """peft's layout: a frozen base Linear and nn.Linear adapters inside ModuleDicts."""

    def __init__(self, d_in, d_out, rank):
        super().__init__()
        self.base_layer = torch.nn.Linear(d_in, d_out).requires_grad_(False)
        self.lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(d_in, rank, bias=False)})
        self.lora_B = torch.nn.ModuleDict({"default": torch.nn.Linear(rank, d_out, bias=False)})

    def forward(self, x):
        return self.base_layer(x) + 2.0 * self.lora_B["default"](self.lora_A["default"](x))


class _TinyEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = _LoraLinear(6, 4, 2)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x, attention_mask):
        h = self.layer(x)
        mask = attention_mask[..., None].to(h.dtype)
        return self.head((h * mask).sum(1) / mask.sum(1))


def test_lora_layers_inside_modules_and_masked_token_positions():
    torch.manual_seed(0)
    model = _TinyEncoder().double()
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    batches = [{"x": x[:2], "attention_mask": mask[:2]}, {"x": x[2:], "attention_mask": mask[2:]}]
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = FOOF(trainable)
    optimizer.attach(_access(model, batches, forward=lambda b: model(b["x"], b["attention_mask"])))
    optimizer.end_round()
    assert optimizer.layers() == [("layer.lora_A.default.weight", None), ("layer.lora_B.default.weight", None),
                                  ("head.weight", "head.bias")]
    kept = x[mask.bool()]  # the 9 unpadded token positions
    with torch.no_grad():
        low_rank = model.layer.lora_A["default"](kept)
        h = model.layer(x) * mask[..., None]
        pooled = h.sum(1) / mask.sum(1, keepdim=True)
    state = {n: optimizer.state[p].get("A") for n, p in trainable}
    torch.testing.assert_close(state["layer.lora_A.default.weight"].double(), _mean_outer(kept), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(state["layer.lora_B.default.weight"].double(), _mean_outer(low_rank), rtol=1e-6,
                               atol=1e-7)
    torch.testing.assert_close(state["head.weight"].double(), _mean_outer(_with_one(pooled)), rtol=1e-6, atol=1e-7)
    assert state["head.bias"] is None and "base_layer.weight" not in optimizer.param_names.values()


def test_conv_layers_use_unfolded_patches():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2, 3, 3, padding=1).double()
    x = torch.randn(2, 2, 4, 4, dtype=torch.float64)
    optimizer = FOOF(conv.named_parameters(), lr=0.1, damping=0.3, weight_decay=0.0)
    optimizer.attach(_access(conv, [{"x": x}]))
    optimizer.before_forward(0, {"x": x})
    padded = F.pad(x, (1, 1, 1, 1))
    patches = torch.stack([padded[b, :, i:i + 3, j:j + 3].reshape(-1) for b in range(2)
                           for i in range(4) for j in range(4)])
    with torch.no_grad():  # the patch order is the weight's flattening order
        out = (patches @ conv.weight.reshape(3, -1).T + conv.bias).reshape(2, 4, 4, 3).permute(0, 3, 1, 2)
        torch.testing.assert_close(conv(x), out)
    A = optimizer.state[conv.weight]["A"].double()
    torch.testing.assert_close(A, _mean_outer(_with_one(patches)), rtol=1e-6, atol=1e-7)
    W_aug = torch.cat([conv.weight.detach().reshape(3, -1), conv.bias.detach()[:, None]], 1)
    conv.weight.grad, conv.bias.grad = torch.randn_like(conv.weight), torch.randn_like(conv.bias)
    G_aug = torch.cat([conv.weight.grad.reshape(3, -1), conv.bias.grad[:, None]], 1)
    expected = W_aug - 0.1 * G_aug @ torch.linalg.inv(A + 0.3 * torch.eye(19, dtype=torch.float64))
    optimizer.step()
    torch.testing.assert_close(conv.weight.detach().reshape(3, -1), expected[:, :18], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(conv.bias.detach(), expected[:, 18], rtol=1e-12, atol=1e-12)


def test_curvature_samples_caps_the_examples_and_batchnorm_statistics_do_not_move():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 2)).double()
    x = torch.randn(15, 4, dtype=torch.float64)
    optimizer = FOOF(model.named_parameters(), curvature_samples=7)
    optimizer.attach(_access(model, [{"x": x[i:i + 5]} for i in range(0, 15, 5)]))
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    optimizer.end_round()
    assert all(torch.equal(buffers[n], b) for n, b in model.named_buffers())
    torch.testing.assert_close(optimizer.state[model[0].weight]["A"].double(), _mean_outer(_with_one(x[:7])),
                               rtol=1e-6, atol=1e-7)


def test_imported_curvature_is_used_as_is_and_end_round_refreshes_it():
    model, x, batches = _mlp()
    optimizer = FOOF(model.named_parameters())
    optimizer.attach(_access(model, batches))
    theta = {"A:0.weight": 2 * torch.eye(5), "A:3.weight": 3 * torch.eye(5)}
    optimizer.import_theta(theta)
    optimizer.before_forward(0, batches[0])
    assert all(torch.equal(optimizer.export_theta()[k], v) for k, v in theta.items())
    optimizer.end_round()
    torch.testing.assert_close(optimizer.export_theta()["A:0.weight"].double(), _mean_outer(_with_one(x)),
                               rtol=1e-6, atol=1e-7)


def test_clear_errors_without_model_or_with_singular_undamped_curvature():
    model, x, _ = _mlp()
    optimizer = FOOF(model.named_parameters(), damping=0.0)
    with pytest.raises(RuntimeError, match="attach"):
        optimizer.layers()
    optimizer.attach(_access(model, [{"x": x[:2]}]))  # 2 examples: A (5 x 5) has rank 2
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match="damping"):
        optimizer.step()
