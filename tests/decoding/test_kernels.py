"""Few-row linear kernels chosen on the machine: the same products, dispatched on the row count."""

import copy
import json

import pytest
import torch
from torch import nn

from specdiff_lightning.decoding import calibration
from specdiff_lightning.decoding.calibration import calibration_key, prepare_kernels
from specdiff_lightning.decoding.kernels import (
    KERNELS,
    choose_linear_kernels,
    linear_kernel_choice,
    packing_available,
    use_linear_kernels,
)
from specdiff_lightning.models import tiny_model

needs_packing = pytest.mark.skipif(
    not packing_available(torch.float32), reason="this torch build has no oneDNN packed inner product"
)


def test_transposed_rows_compute_the_same_product_and_others_stay_stock():
    torch.manual_seed(0)
    layer = nn.Linear(24, 40)
    x = {m: torch.randn(1, m, 24) for m in (1, 2, 3, 5)}
    expected = {m: layer(v) for m, v in x.items()}
    model = nn.Sequential(layer)
    use_linear_kernels(model, {2, 3})  # a plain set of rows: W @ x^T
    assert linear_kernel_choice(model) == {"transposed": [2, 3]}
    with torch.no_grad():
        for m, v in x.items():
            torch.testing.assert_close(layer(v), expected[m], rtol=1e-6, atol=1e-6)
    use_linear_kernels(model, set())  # back to stock F.linear
    assert "forward" not in layer.__dict__ and linear_kernel_choice(model) == {}


@needs_packing
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_rows_compute_the_same_product_at_every_size_between_and_past_the_grid(dtype):
    if not packing_available(dtype):
        pytest.skip(f"no packed inner product in {dtype} here")
    torch.manual_seed(0)
    layer = nn.Linear(32, 48).to(dtype)
    model = nn.Sequential(layer)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    x = {m: torch.randn(2, m, 32, dtype=dtype) for m in (1, 3, 8, 20, 70)}  # 2 x 70 rows: past the grid
    with torch.no_grad():
        expected = {m: layer(v) for m, v in x.items()}
        use_linear_kernels(model, {1: "packed", 16: "packed", 24: "packed", 64: "packed", 2: "transposed"})
        assert linear_kernel_choice(model) == {"transposed": [2], "packed": [1, 16, 24, 64]}
        for m, v in x.items():
            torch.testing.assert_close(layer(v), expected[m], **tol)
        # the weight changes (a dtype cast, an in-place update): the packed copy is remade, never stale
        layer.weight.mul_(2)
        torch.testing.assert_close(layer(x[1]), 2 * expected[1] - layer.bias, **tol)


@needs_packing
def test_a_packed_model_deep_copies_casts_and_trains_through_F_linear():
    model = tiny_model("llama", vocab_size=64, hidden_size=64, num_layers=1)
    use_linear_kernels(model, dict.fromkeys(range(1, 65), "packed"))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        ref = model(ids).logits
    twin = copy.deepcopy(model)  # the packed copies stay out of the module: a deep copy works
    with torch.no_grad():
        torch.testing.assert_close(twin(ids).logits, ref, rtol=1e-5, atol=1e-5)
    if packing_available(torch.bfloat16):
        with torch.no_grad():
            low = twin.to(torch.bfloat16)(ids).logits  # repacked in the new dtype
        torch.testing.assert_close(low.float(), ref, rtol=0.1, atol=0.1)
    # a graph through the frozen model (a drafter trained through the verifier's head) has a backward
    h = torch.randn(1, 4, 64, requires_grad=True)
    model.lm_head(h).sum().backward()
    assert h.grad is not None and torch.isfinite(h.grad).all()


def test_unknown_kernels_are_refused_naming_the_kernels():
    with pytest.raises(ValueError, match="unknown linear kernel.*'linear', 'transposed', 'packed'"):
        use_linear_kernels(nn.Sequential(nn.Linear(4, 4)), {2: "fast"})
    assert KERNELS == ("linear", "transposed", "packed")


def test_the_choice_is_measured_on_the_models_own_weights_and_enters_the_calibration_key():
    model = tiny_model("llama", vocab_size=64, hidden_size=64, num_layers=1)
    chosen = choose_linear_kernels(model, rows=(1, 2, 4), repeats=5)
    assert set(chosen) <= {1, 2, 4} and set(chosen.values()) <= {"transposed", "packed"}
    use_linear_kernels(model, {2: "transposed"})
    assert calibration_key(model)["model"]["linear_kernels"] == {"transposed": [2]}  # a cost model each
    ids = torch.tensor([[1, 2, 3, 4]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)
    use_linear_kernels(model, set())
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)
    assert torch.equal(out, ref)


def test_the_compiled_formulation_is_measured_and_cached_with_the_kernels(tmp_path, monkeypatch):
    """choose_compiled_kernels streams every weight in both formulations and returns a plan a model
    takes; prepare_kernels caches it beside the eager choice, and the cost models key on it."""
    from specdiff_lightning.decoding import kernels
    from specdiff_lightning.decoding.kernels import (
        COMPILED_KERNELS,
        choose_compiled_kernels,
        compiled_kernels,
        cpp_gemm_available,
    )

    model = tiny_model("llama", vocab_size=64, hidden_size=64, num_layers=2)
    plan = choose_compiled_kernels(model, rows=(2, 4), repeats=2)
    assert set(plan) == {"kernel", "one_node", "gemm"} and plan["kernel"] in COMPILED_KERNELS
    # where inductor's C++ GEMM template runs, inductor measures every GEMM itself
    assert plan["gemm"] == ("autotune" if cpp_gemm_available() else "stock")
    monkeypatch.setattr(kernels, "cpp_gemm_available", lambda device="cpu": False)
    measured = choose_compiled_kernels(model, rows=(2, 4), repeats=2)
    assert measured["gemm"] == "stock" and measured["kernel"] in COMPILED_KERNELS
    monkeypatch.setattr(calibration, "calibration_dir", lambda: tmp_path)
    chosen = {"kernel": "transposed", "one_node": True, "gemm": "stock"}
    monkeypatch.setattr(calibration, "choose_compiled_kernels", lambda m: dict(chosen))
    prepare_kernels(model)
    (path,) = tmp_path.glob("kernels-*.json")
    assert json.loads(path.read_text())["compiled"] == chosen
    assert compiled_kernels(model) == chosen
    assert calibration_key(model)["model"]["compiled_kernels"] == compiled_kernels(model)
    use_linear_kernels(model, {})
    assert compiled_kernels(model) == {"kernel": "linear", "one_node": False, "gemm": "stock"}  # stock again
    with pytest.raises(ValueError, match="compiled linear kernel"):
        use_linear_kernels(model, {}, {"kernel": "packed"})
    with pytest.raises(ValueError, match="compiled GEMM"):
        use_linear_kernels(model, {}, {"gemm": "cublas"})


def test_a_cached_choice_of_an_older_format_or_a_corrupt_one_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setattr(calibration, "calibration_dir", lambda: tmp_path)
    calls = []
    monkeypatch.setattr(calibration, "choose_linear_kernels", lambda m: calls.append(1) or {3: "transposed"})
    model = tiny_model("llama", vocab_size=64, hidden_size=64, num_layers=1)
    prepare_kernels(model)
    (path,) = tmp_path.glob("kernels-*.json")
    assert json.loads(path.read_text())["kernels"] == {"3": "transposed"} and len(calls) == 1
    prepare_kernels(model)  # cached
    assert len(calls) == 1 and linear_kernel_choice(model) == {"transposed": [3]}
    data = json.loads(path.read_text())
    path.write_text(json.dumps({"key": data["key"], "rows": [3]}))  # the format before packed weights
    prepare_kernels(model)
    data = json.loads(path.read_text())
    del data["compiled"]
    path.write_text(json.dumps({**data, "version": 2}))  # before the compiled formulation
    prepare_kernels(model)
    path.write_text("{not json")
    prepare_kernels(model)
    assert len(calls) == 4 and linear_kernel_choice(model) == {"transposed": [3]}


@needs_packing
def test_greedy_decoding_through_packed_weights_is_identical_to_the_verifiers_own_generate():
    """Lossless with the packed kernel in every linear layer: tree forwards of any size and the
    one-token steps of stock ``generate()`` (same model, same dispatch) give the same tokens."""
    from helpers import NoisyOracleDrafter, reference_greedy
    from specdiff_lightning import speculative_generate

    verifier = tiny_model("qwen2", vocab_size=48, seed=4)  # float32
    use_linear_kernels(verifier, dict.fromkeys(range(1, 65), "packed"))
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    ref = reference_greedy(verifier, prompt, 40)
    for tree in ("auto", None):
        out = speculative_generate(
            verifier, NoisyOracleDrafter(verifier, noise=0.2), prompt, max_new_tokens=40, gamma=6,
            num_drafts=2 if tree is None else 1, temperature=0, eos_token_id=[], tree=tree,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        assert torch.equal(out.sequences, ref), tree
    use_linear_kernels(verifier, {})
    assert torch.equal(reference_greedy(verifier, prompt, 40), ref)  # and to stock F.linear's
