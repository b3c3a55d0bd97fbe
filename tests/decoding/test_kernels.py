"""Few-row linear kernels chosen on the machine: the same products, dispatched on the row count."""

import torch
from torch import nn

from specdiff_lightning.decoding.calibration import calibration_key
from specdiff_lightning.decoding.kernels import choose_linear_kernels, linear_kernel_rows, use_linear_kernels
from specdiff_lightning.models import tiny_model


def test_transposed_rows_compute_the_same_product_and_others_stay_stock():
    torch.manual_seed(0)
    layer = nn.Linear(24, 40)
    x = {m: torch.randn(1, m, 24) for m in (1, 2, 3, 5)}
    expected = {m: layer(v) for m, v in x.items()}
    model = nn.Sequential(layer)
    use_linear_kernels(model, {2, 3})
    assert linear_kernel_rows(model) == [2, 3]
    for m, v in x.items():
        torch.testing.assert_close(layer(v), expected[m], rtol=1e-6, atol=1e-6)
    use_linear_kernels(model, set())  # back to stock F.linear
    assert "forward" not in layer.__dict__ and linear_kernel_rows(model) == []


def test_the_choice_is_measured_on_the_models_own_weights_and_enters_the_calibration_key():
    model = tiny_model("llama", vocab_size=64, hidden_size=64, num_layers=1)
    chosen = choose_linear_kernels(model, rows=(2, 4), repeats=5)
    assert chosen <= {2, 4}
    use_linear_kernels(model, {2})
    assert calibration_key(model)["model"]["linear_kernels"] == [2]  # a cost model per kernel choice
    ids = torch.tensor([[1, 2, 3, 4]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)
    use_linear_kernels(model, set())
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)
    assert torch.equal(out, ref)
