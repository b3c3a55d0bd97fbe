"""The DFlash drafter over transformers' stock class: exact cached rounds, lossless decoding in our
loop, both checkpoint layouts round-tripped bitwise, clear errors for a verifier it cannot read, and
the same outputs as transformers' own DFlash generate()."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file

from helpers import reference_greedy
from specdiff_lightning import DFlashDrafter, DiffusionDrafter, speculative_generate
from specdiff_lightning.models import tiny_model

VOCAB = 48
TARGETS = (0, 2)  # DFlash ids: outputs of decoder layers 0 and 2 (hidden_states 1 and 3)


def _verifier(arch="llama", dtype=torch.float64, **kw):
    kw.setdefault("num_layers", 3)
    return tiny_model(arch, vocab_size=kw.pop("vocab_size", VOCAB), seed=0, dtype=dtype, **kw)


def _drafter(verifier, block_size=5, seed=1):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        drafter = DFlashDrafter.build(verifier, 1, TARGETS, VOCAB - 1, block_size)
    # The stock init (std 0.02) leaves the layers near the identity; larger weights give the drafts
    # (and so the trees and acceptances the tests walk through) some structure.
    with torch.no_grad():
        for p in drafter.model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    return drafter


def _features(verifier, ids, layers):
    with torch.no_grad():
        states = verifier(input_ids=ids, output_hidden_states=True).hidden_states
    return torch.cat([states[i] for i in layers], dim=-1)


def test_target_layer_ids_read_the_hidden_states_after_those_layers():
    drafter = _drafter(_verifier())
    assert drafter.target_layer_ids == TARGETS
    assert drafter.feature_layers == (1, 3)  # HF hidden_states[0] is the embeddings


def test_cached_rounds_equal_one_forward_over_the_whole_context():
    """Round by round through a growing prefix, the cached block logits equal those of a fresh drafter
    that sees the whole context at once."""
    verifier = _verifier()
    drafter = _drafter(verifier)
    seq = torch.randint(0, VOCAB - 1, (1, 16), generator=torch.Generator().manual_seed(0))
    feats = _features(verifier, seq, drafter.feature_layers)[0]
    drafter.observe(feats[:4])
    ends = [5, 6, 9, 11, 14]
    for i, n in enumerate(ends):
        with torch.no_grad():
            cached = drafter.block_logits(seq[:, :n])
            fresh = _drafter(verifier)
            fresh.observe(feats[: n - 1])
            whole = fresh.block_logits(seq[:, :n])
        assert cached.shape == (1, drafter.block_size - 1, VOCAB)
        torch.testing.assert_close(cached, whole, rtol=1e-9, atol=1e-9)
        if i + 1 < len(ends):
            drafter.observe(feats[n - 1 : ends[i + 1] - 1])


def test_the_training_forward_drafts_what_each_decoding_round_drafts():
    """Many blocks of two right-padded sequences in one training forward give, block for block, the
    logits of a decoding round with that prefix (training sees what decoding sees)."""
    verifier = _verifier()
    drafter = _drafter(verifier)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB - 1, (2, 14), generator=gen)
    lengths = torch.tensor([14, 10])
    ids[1, 10:] = 0  # padding: never seen by a block of row 1
    feats = torch.zeros(2, 14, 2 * verifier.config.hidden_size, dtype=torch.float64)
    for b, n in enumerate(lengths.tolist()):
        feats[b, :n] = _features(verifier, ids[b : b + 1, :n], drafter.feature_layers)[0]
    starts = torch.tensor([[1, 5, 13], [2, 7, 9]])
    with torch.no_grad():
        logits = drafter.blocks_logits(feats, ids, starts)
    assert logits.shape == (2, 3, drafter.block_size - 1, VOCAB)
    for b in range(2):
        for m, t in enumerate(starts[b].tolist()):
            fresh = _drafter(verifier)
            fresh.observe(feats[b, : t - 1])
            with torch.no_grad():
                round_logits = fresh.block_logits(ids[b : b + 1, :t])
            torch.testing.assert_close(logits[b, m], round_logits[0], rtol=1e-9, atol=1e-9)
    with torch.no_grad():
        short = drafter.blocks_logits(feats, ids, starts, gamma=2)
    torch.testing.assert_close(short, logits[:, :, :2], rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="drafts 1..4 tokens"):
        drafter.blocks_logits(feats, ids, starts, gamma=5)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tree", ["auto", None])
def test_greedy_decoding_is_identical_to_the_verifier(arch, tree):
    verifier = _verifier(arch)
    drafter = _drafter(verifier)
    ids = torch.randint(0, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(2))
    ref = reference_greedy(verifier, ids, 24)
    for num_drafts in (1, 3):
        out = speculative_generate(
            verifier,
            drafter,
            ids,
            max_new_tokens=24,
            gamma=4,
            num_drafts=num_drafts,
            temperature=0,
            tree=tree,
        )
        assert torch.equal(out.sequences, ref)


def test_float32_greedy_decoding_and_a_second_sequence():
    verifier = _verifier(dtype=torch.float32)
    drafter = _drafter(verifier)
    for ids in (torch.tensor([[3]]), torch.tensor([[5, 9, 11, 2, 7]])):
        out = speculative_generate(verifier, drafter, ids, max_new_tokens=16, gamma=4, temperature=0)
        assert torch.equal(out.sequences, reference_greedy(verifier, ids, 16))


def test_every_anchor_scored_and_walked_gives_the_rounds_greedy_decoding_accepts():
    """The teacher-forced decode path (``val/decode_accepted``) is what the loop accepts round by
    round along the verifier's greedy continuation: the same blocks, started where decoding starts."""
    from specdiff_lightning.training.losses import decode_path_streaks, greedy_chain_streaks
    from specdiff_lightning.training.slice_drafter import block_targets

    verifier = _verifier()
    drafter = _drafter(verifier)
    prompts = [
        torch.randint(0, VOCAB - 1, (1, 5), generator=torch.Generator().manual_seed(s)) for s in range(4)
    ]
    seqs = [reference_greedy(verifier, p, 40) for p in prompts]
    feats = [_features(verifier, s, drafter.feature_layers) for s in seqs]

    def blocks(i):
        length = seqs[i].shape[1]
        starts = torch.arange(prompts[i].shape[1], length)[None]
        return starts, block_targets(seqs[i], torch.tensor([length]), starts, 4)[0]

    # a drafter that has half learnt these continuations, so rounds accept drafts of several lengths
    drafter.model.train()
    opt = torch.optim.Adam(drafter.model.parameters(), lr=3e-3)
    for _ in range(3):
        for i in range(len(seqs)):
            starts, targets = blocks(i)
            logits = drafter.blocks_logits(feats[i], seqs[i], starts, 4)[0]
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), targets.flatten(), ignore_index=-100
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
    drafter.model.eval()
    decoded_all = []
    for i, prompt in enumerate(prompts):
        drafter.reset()
        out = speculative_generate(
            verifier,
            drafter,
            prompt,
            max_new_tokens=40,
            gamma=4,
            temperature=0,
            tree=None,
            draft_temperature=0.0,
        )
        assert torch.equal(out.sequences, seqs[i])
        starts, targets = blocks(i)  # round 1 drafts x_c.. after the prompt x_0..x_{c-1}
        with torch.no_grad():
            streaks = greedy_chain_streaks(
                drafter.blocks_hidden(feats[i], seqs[i], starts, 4)[0], drafter.head, targets
            )
        walked = decode_path_streaks(streaks).tolist()
        decoded = [r.accepted for r in out.stats.rounds]
        assert walked[:-1] == decoded[: len(walked) - 1]  # the last round is cut by the token budget
        decoded_all += decoded
    assert len(set(decoded_all)) >= 3  # rounds of several lengths: the walk is tested past zero streaks


def test_a_ranked_draft_vocabulary_travels_with_the_drafter_and_drafts_only_its_ids(tmp_path):
    verifier = _verifier()
    ranking = [40, 3, 17, 9, 22, 0, 31, 8, 44, 12, 5, 27]  # most frequent first
    full = _drafter(verifier)
    DFlashDrafter(full.model, verifier, vocab_ranking=ranking).save_pretrained(tmp_path / "d")
    assert json.loads((tmp_path / "d" / "draft_vocab.json").read_text())["ranking"] == ranking
    ranked = DFlashDrafter.from_pretrained(tmp_path / "d", verifier=verifier, head_vocab=6)
    assert ranked.vocab_ranking == ranking and ranked.draft_vocab.ids.tolist() == sorted(ranking[:6])
    first = DFlashDrafter.from_pretrained(tmp_path / "d", verifier=verifier, head_vocab=6, ranked_vocab=False)
    assert first.draft_vocab.ids.tolist() == list(range(6))
    ids = torch.randint(0, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(4))
    for d in (full, ranked):
        d.observe(_features(verifier, ids[:, :-1], d.feature_layers)[0])
    with torch.no_grad():
        a, b = full.block_logits(ids), ranked.block_logits(ids, rows=3)
    assert b.shape == (1, 3, VOCAB)  # the head reads the rows asked for only
    top = sorted(ranking[:6])
    torch.testing.assert_close(b[..., top], a[:, :3, top], rtol=1e-9, atol=1e-9)
    others = [i for i in range(VOCAB) if i not in top]
    assert torch.isinf(b[..., others]).all()
    ranked.reset()
    out = speculative_generate(verifier, ranked, ids, max_new_tokens=16, gamma=4, temperature=0, tree=None)
    assert torch.equal(out.sequences, reference_greedy(verifier, ids, 16))
    # the eager loop runs under inference_mode; what it returns and what it keeps are plain tensors
    # (writable; usable by a later compiled decode or a training step)
    assert not out.sequences.is_inference() and not ranked.draft_vocab._rows(ranked.head)[0].is_inference()
    out.sequences[0, 0] = 1
    # the z-lab layout carries it too; a head wider than the ranking takes the other ids in order
    ranked.save_pretrained(tmp_path / "z", layout="zlab")
    wide = DFlashDrafter.from_pretrained(tmp_path / "z", verifier=verifier, head_vocab=14)
    assert wide.draft_vocab.ids.tolist() == sorted(ranking + [1, 2])


@pytest.mark.parametrize(
    "text, problem",
    [("{not json", "unreadable"), ('{"ranking": [1, 1]}', "distinct"), ('{"ranking": [48]}', "distinct")],
)
def test_a_bad_draft_vocabulary_file_is_a_clear_error_naming_it(tmp_path, text, problem):
    verifier = _verifier()
    _drafter(verifier).save_pretrained(tmp_path / "d")
    (tmp_path / "d" / "draft_vocab.json").write_text(text)
    with pytest.raises(ValueError, match=rf"draft_vocab\.json.*{problem}"):
        DFlashDrafter.from_pretrained(tmp_path / "d", verifier=verifier, head_vocab=6)


def test_a_head_over_the_first_ids_drafts_only_those_and_stays_lossless(tmp_path):
    verifier = _verifier()
    full = _drafter(verifier)
    full.save_pretrained(tmp_path / "d")
    small = DFlashDrafter.from_pretrained(tmp_path / "d", verifier=verifier, head_vocab=20)
    ids = torch.randint(0, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(4))
    full.observe(_features(verifier, ids[:, :-1], full.feature_layers)[0])
    small.observe(_features(verifier, ids[:, :-1], small.feature_layers)[0])
    with torch.no_grad():
        a, b = full.block_logits(ids), small.block_logits(ids)
    torch.testing.assert_close(b[..., :20], a[..., :20], rtol=1e-9, atol=1e-9)
    assert torch.isinf(b[..., 20:]).all()
    small.reset()
    # tree=None: the drafter's own drafts (an auto tree may add copies of the context's tokens)
    out = speculative_generate(verifier, small, ids, max_new_tokens=16, gamma=4, temperature=0, tree=None)
    assert torch.equal(out.sequences, reference_greedy(verifier, ids, 16))
    assert all(t < 20 for r in out.stats.rounds for t in r.draft)
    with pytest.raises(ValueError, match="head_vocab=0 must lie in"):
        DFlashDrafter(full.model, verifier, head_vocab=0)


@pytest.mark.parametrize("limit", [None, 30])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_draft_vocabulary_proposes_from_compact_logits_what_its_full_rows_give(
    tmp_path, limit, temperature
):
    """With a draft vocabulary, propose() keeps the head's logits compact (Proposal.support: no full
    vocabulary row is reduced); its drafts and q are those of the full rows (-inf off the
    vocabulary), within a restricted vocabulary too; greedy decoding through tree: auto stays the
    verifier's."""
    from specdiff_lightning.decoding.drafting import sample_from_marginals

    verifier = _verifier()
    ranking = [40, 3, 17, 9, 22, 0, 31, 8, 44, 12, 5, 27, 35, 14]
    _drafter(verifier).save_pretrained(tmp_path / "d")
    (tmp_path / "d" / "draft_vocab.json").write_text(json.dumps({"ranking": ranking}))
    ranked = DFlashDrafter.from_pretrained(tmp_path / "d", verifier=verifier, head_vocab=10)
    ranked.restrict_vocab(limit)
    ids = torch.randint(0, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(4))
    features = _features(verifier, ids[:, :-1], ranked.feature_layers)[0]
    ranked.observe(features)
    with torch.no_grad():
        got = ranked.propose(ids, 4, 3, temperature, torch.Generator().manual_seed(2))
        ranked.reset()
        ranked.observe(features)
        rows = ranked._restrict_logits(ranked.block_logits(ids, 4))
    want = sample_from_marginals(rows, 3, temperature, torch.Generator().manual_seed(2))
    kept = sorted(i for i in ranking[:10] if limit is None or i < limit)
    assert got.support.tolist() == kept and got.logits.shape == (1, 4, len(kept))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.probs, want.probs)
    assert torch.equal(got.full_logits(), rows)
    ranked.reset()
    ranked.restrict_vocab(None)
    out = speculative_generate(verifier, ranked, ids, max_new_tokens=16, gamma=4, temperature=0, tree="auto")
    assert torch.equal(out.sequences, reference_greedy(verifier, ids, 16))


def test_drafts_stop_at_the_block_when_gamma_is_larger():
    """A block of 4 drafts 3 tokens; standard acceptance over the drafts as drawn stays exact."""
    verifier = _verifier()
    drafter = _drafter(verifier, block_size=4)
    ids = torch.tensor([[4, 9, 4, 9, 4]])
    out = speculative_generate(
        verifier, drafter, ids, max_new_tokens=20, gamma=6, temperature=0, acceptance="standard", tree=None
    )
    assert torch.equal(out.sequences, reference_greedy(verifier, ids, 20))
    assert all(r.drafted <= 3 for r in out.stats.rounds)


def test_drafting_without_the_verifiers_features_is_a_clear_error():
    drafter = _drafter(_verifier())
    with pytest.raises(ValueError, match="speculative_generate"):
        drafter.propose(torch.tensor([[1, 2, 3]]), 4)


def test_a_saved_drafter_runs_under_transformers_dflash_generate(tmp_path):
    """What we save in transformers' layout, the stock class loads, and HF generate(speculation_type=
    "dflash") with it is greedy-identical to the verifier."""
    from transformers import MuseGlimmerAssistantModel

    verifier = _verifier()
    _drafter(verifier).save_pretrained(tmp_path / "hf")
    assistant = MuseGlimmerAssistantModel.from_pretrained(tmp_path / "hf", dtype=torch.float64)
    ids = torch.randint(0, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(5))
    out = verifier.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        assistant_model=assistant,
        speculation_type="dflash",
        do_sample=False,
        max_new_tokens=20,
        pad_token_id=0,
    )
    assert torch.equal(out, reference_greedy(verifier, ids, 20))


def _tensors(drafter):
    return {k: v.clone() for k, v in drafter.model.state_dict().items()}


@pytest.mark.parametrize("layout", ["hf", "zlab"])
def test_layouts_round_trip_bitwise(tmp_path, layout):
    verifier = _verifier()
    drafter = _drafter(verifier)
    drafter.save_pretrained(tmp_path / "a", layout=layout)
    assert all(f.stat().st_mode & 0o077 == 0o044 for f in (tmp_path / "a").iterdir())  # readable by others
    again = DFlashDrafter.from_pretrained(tmp_path / "a", verifier=verifier)
    original, loaded = _tensors(drafter), _tensors(again)
    assert original.keys() == loaded.keys()
    assert all(torch.equal(original[k], loaded[k]) and original[k].dtype == loaded[k].dtype for k in original)
    assert (again.block_size, again.mask_token_id, again.target_layer_ids) == (5, VOCAB - 1, TARGETS)
    again.save_pretrained(tmp_path / "b", layout=layout)
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_the_zlab_layout_carries_zlabs_names_and_converts_to_transformers(tmp_path):
    verifier = _verifier()
    drafter = _drafter(verifier)
    drafter.save_pretrained(tmp_path / "z", layout="zlab")
    config = json.loads((tmp_path / "z" / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"] == {
        "block_size": 5,
        "mask_token_id": VOCAB - 1,
        "target_layer_ids": [0, 2],
    }
    assert config["num_target_layers"] == 3 and "auto_map" not in config
    names = set(load_file(tmp_path / "z" / "model.safetensors"))
    assert {"fc.weight", "hidden_norm.weight"} <= names and not any(n.startswith("encoder.") for n in names)
    DFlashDrafter.from_pretrained(tmp_path / "z", verifier=verifier).save_pretrained(tmp_path / "hf")
    hf = load_file(tmp_path / "hf" / "model.safetensors")
    assert all(torch.equal(hf[k], v) for k, v in _tensors(drafter).items())


def test_a_zlab_checkpoints_auto_map_is_ignored_and_its_code_never_runs(tmp_path):
    verifier = _verifier()
    _drafter(verifier).save_pretrained(tmp_path / "z", layout="zlab")
    config = json.loads((tmp_path / "z" / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_dflash.DFlashDraftModel"}
    # top-level DFlash fields, as some published configs carry them
    config.update(config.pop("dflash_config"))
    (tmp_path / "z" / "config.json").write_text(json.dumps(config))
    (tmp_path / "z" / "modeling_dflash.py").write_text('raise RuntimeError("checkpoint code was executed")\n')
    with pytest.warns(UserWarning, match="auto_map .* ignored"):
        drafter = DFlashDrafter.from_pretrained(tmp_path / "z", verifier=verifier)
    assert drafter.mask_token_id == VOCAB - 1 and drafter.target_layer_ids == TARGETS


def _saved(tmp_path, layout="zlab"):
    verifier = _verifier()
    _drafter(verifier).save_pretrained(tmp_path / layout, layout=layout)
    return tmp_path / layout


@pytest.mark.parametrize(
    ("verifier_kw", "field"),
    [
        ({"num_layers": 2}, "target_layer_ids"),
        ({"hidden_size": 64}, "hidden_size"),
        ({"vocab_size": 64}, "vocab_size"),
    ],
)
def test_a_verifier_the_drafter_cannot_read_is_a_one_line_error(tmp_path, verifier_kw, field):
    path = _saved(tmp_path)
    with pytest.raises(ValueError, match=field) as err:
        DFlashDrafter.from_pretrained(path, verifier=_verifier(**verifier_kw))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("layout", ["hf", "zlab"])
def test_a_checkpoint_without_mask_token_id_is_a_clear_error(tmp_path, layout):
    path = _saved(tmp_path, layout)
    config = json.loads((path / "config.json").read_text())
    config.pop("mask_token_id", None)
    config.get("dflash_config", {}).pop("mask_token_id", None)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no mask_token_id"):
        DFlashDrafter.from_pretrained(path, verifier=_verifier())


def test_not_a_dflash_checkpoint_and_pickled_weights_are_clear_errors(tmp_path):
    verifier = _verifier()
    verifier.save_pretrained(tmp_path / "v")
    with pytest.raises(ValueError, match="not a DFlash drafter"):
        DFlashDrafter.from_pretrained(tmp_path / "v", verifier=verifier)
    path = _saved(tmp_path)
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pickles"):
        DFlashDrafter.from_pretrained(path, verifier=verifier)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="layout"):
            _drafter(verifier).save_pretrained(tmp_path / "x", layout="vllm")


def test_load_drafter_reads_both_layouts(tmp_path):
    from specdiff_lightning import load_drafter

    verifier = _verifier()
    drafter = _drafter(verifier)
    for layout in ("hf", "zlab"):
        drafter.save_pretrained(tmp_path / layout, layout=layout)
        loaded = load_drafter(str(tmp_path / layout), verifier=verifier)
        assert isinstance(loaded, DFlashDrafter)
        assert all(
            torch.equal(a, b)
            for a, b in zip(_tensors(drafter).values(), _tensors(loaded).values(), strict=True)
        )
    with pytest.raises(ValueError, match="DFlash drafter"):
        load_drafter(str(tmp_path / "hf"), verifier=verifier, steps=2)
    with pytest.raises(ValueError, match="DFlashDrafter.from_pretrained"):
        DiffusionDrafter.from_pretrained(str(tmp_path / "zlab"))


# ---------------------------------------------------------------------------- z-lab's reference (oracle)
def _reference():
    """z-lab's ``dflash`` package: a test dependency (``make venv`` installs it), never skipped."""
    try:
        from dflash.model import DFlashDraftModel, dflash_generate, extract_context_feature
    except ImportError as err:
        pytest.fail(
            f"the DFlash interop tests need z-lab's reference package ({err}): "
            f"pip install --no-deps dflash==0.1.0"
        )
    return DFlashDraftModel, dflash_generate, extract_context_feature


def test_a_zlab_checkpoint_drafts_the_block_logits_of_zlabs_reference(tmp_path):
    """A tiny z-lab-layout checkpoint (raw tensors under the published names, sharded, with an
    auto_map to code that raises): round by round, our cached block logits equal the reference
    model's over the whole context, its own feature extraction included (target_layer_ids + 1)."""
    from hub_layout import write_dflash_zlab

    reference_cls, _, extract = _reference()
    path = write_dflash_zlab(tmp_path / "z", target_layer_ids=TARGETS, mask_token_id=VOCAB - 1, shards=2)
    verifier = _verifier()
    with pytest.warns(UserWarning, match="auto_map"):
        ours = DFlashDrafter.from_pretrained(path, verifier=verifier)
    theirs = reference_cls.from_pretrained(path, dtype=torch.float64).eval()
    seq = torch.randint(0, VOCAB - 1, (1, 14), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        states = verifier(input_ids=seq, output_hidden_states=True).hidden_states
    context = extract(states, theirs.target_layer_ids)  # [1, L, 2H]: z-lab's indexing
    feats = _features(verifier, seq, ours.feature_layers)[0]  # ours: what the loop hands the drafter
    ends = [4, 5, 9, 14]
    ours.observe(feats[: ends[0] - 1])
    for i, n in enumerate(ends):
        block = torch.cat([seq[0, n - 1 : n], torch.full((4,), VOCAB - 1)])
        with torch.no_grad():
            hidden = theirs(
                target_hidden=context[:, : n - 1],
                noise_embedding=verifier.get_input_embeddings()(block[None]),
                position_ids=torch.arange(n - 1 + 5)[None],
                use_cache=False,
            )
            expected = theirs.compute_logits(hidden[:, 1:], verifier.lm_head)
            got = ours.block_logits(seq[:, :n])
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
        if i + 1 < len(ends):
            ours.observe(feats[n - 1 : ends[i + 1] - 1])


def test_a_drafter_we_export_runs_greedy_identical_under_zlabs_loop(tmp_path):
    reference_cls, dflash_generate, _ = _reference()
    verifier = _verifier()
    _drafter(verifier).save_pretrained(tmp_path / "z", layout="zlab")
    theirs = reference_cls.from_pretrained(tmp_path / "z", dtype=torch.float64).eval()
    ids = torch.randint(0, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(8))
    out = dflash_generate(
        theirs, target=verifier, input_ids=ids, max_new_tokens=20, stop_token_ids=None, temperature=0.0
    )
    assert torch.equal(out, reference_greedy(verifier, ids, 20))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"dflash_config": {"conv_kernel_size": 4}}, "DFlash2"),
        ({"dflash_config": {"input_embedding_scale": 2.0}}, "input_embedding_scale=2.0"),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        ({"layer_types": ["sliding_attention"], "sliding_window": 8}, "sliding-window"),
        ({"attention_bias": True}, "attention_bias"),
    ],
)
def test_zlab_variants_the_stock_class_would_run_differently_are_refused(tmp_path, change, match):
    path = _saved(tmp_path)
    config = json.loads((path / "config.json").read_text())
    for key, value in change.items():
        config[key] = {**config[key], **value} if key == "dflash_config" else value
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match) as err:
        DFlashDrafter.from_pretrained(path, verifier=_verifier())
    assert "\n" not in str(err.value)


def test_neutral_zlab_scales_load(tmp_path):
    path = _saved(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["dflash_config"].update(input_embedding_scale=1.0, output_multiplier=1)
    config["final_logit_softcapping"] = 0.0  # z-lab's reference applies a softcap only when > 0
    (path / "config.json").write_text(json.dumps(config))
    assert DFlashDrafter.from_pretrained(path, verifier=_verifier()).block_size == 5


def test_a_drafter_in_another_dtype_than_its_verifier_stays_lossless(tmp_path):
    """A bfloat16 drafter for a float32 verifier: inputs and outputs are cast at the boundaries."""
    verifier = _verifier(dtype=torch.float32)
    _drafter(verifier).save_pretrained(tmp_path / "d")
    drafter = DFlashDrafter.from_pretrained(tmp_path / "d", verifier=verifier, dtype="bfloat16")
    assert next(drafter.model.parameters()).dtype == torch.bfloat16
    ids = torch.tensor([[5, 9, 11, 2, 7]])
    out = speculative_generate(verifier, drafter, ids, max_new_tokens=12, gamma=4, temperature=0, tree=None)
    assert torch.equal(out.sequences, reference_greedy(verifier, ids, 12))


@pytest.mark.parametrize(("acceptance", "num_drafts"), [("standard", 1), ("recursive", 3), ("greedy", 3)])
def test_sampled_decoding_runs_with_every_rule(acceptance, num_drafts):
    verifier = _verifier()
    drafter = _drafter(verifier)
    ids = torch.tensor([[5, 9, 11]])
    out = speculative_generate(
        verifier,
        drafter,
        ids,
        max_new_tokens=12,
        gamma=4,
        num_drafts=num_drafts,
        acceptance=acceptance,
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
        tree=None,
    )
    assert out.sequences.shape[1] <= 3 + 12 and int(out.sequences.max()) < VOCAB


def test_the_loop_hands_the_drafter_the_features_zlabs_reference_reads():
    """What TreeVerifier selects for feature_layers (hidden states requested by index, the last
    layer's included) equals z-lab's extract_context_feature over all hidden states."""
    from specdiff_lightning.decoding.verifier import TreeVerifier

    _, _, extract = _reference()
    verifier = _verifier()
    drafter = _drafter(verifier)
    ids = torch.randint(0, VOCAB - 1, (1, 9), generator=torch.Generator().manual_seed(9))
    state = TreeVerifier(verifier, ids, drafter.feature_layers)
    with torch.no_grad():
        states = verifier(input_ids=ids[:, :-1], output_hidden_states=True).hidden_states
    assert torch.equal(state.new_features, extract(states, list(drafter.target_layer_ids))[0])
