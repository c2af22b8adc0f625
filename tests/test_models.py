"""The two presets: architecture checks, offline loading, safetensors round trips, digests, tokenizer facts."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from labkit.models import presets
from labkit.lab.runs import read_json
from labkit.models.tokenizer import load_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


# -- qwen: the architecture on the meta device ------------------------------------------


def test_qwen_architecture_has_the_published_count_and_tied_embeddings():
    model = presets.qwen_architecture()
    assert model.model.embed_tokens.weight.device.type == "meta"
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # Counted by hand from config.json: embedding 151936*896 once (tied), then per layer
    # q 896*896+896, k and v 896*128+128 each, o 896*896, MLP 3*896*4864, two norms 896,
    # and the final norm 896.
    per_layer = (896 * 896 + 896) + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
    assert 151936 * 896 + 24 * per_layer + 896 == presets.QWEN_PARAMETERS == 494_032_768
    assert presets.count_unique_parameters(model) == 494_032_768
    assert model.config._attn_implementation == "eager"
    presets.check_qwen(model)  # accepts it


def test_check_qwen_refuses_untied_embeddings_and_names_the_count():
    config = presets.qwen_config()
    config.tie_word_embeddings = False
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    with pytest.raises(ValueError) as err:
        presets.check_qwen(model)
    message = str(err.value)
    assert "tie_word_embeddings" in message and "must be tied" in message
    # An untied head adds a second 151936 x 896 matrix.
    assert f"{494_032_768 + 151936 * 896:,} unique trainable parameters, expected 494,032,768" in message


# -- qwen: the loading path, on a small Qwen2 saved to a temporary folder ------------------


@pytest.fixture
def small_qwen_dir(tmp_path, tokenizer):
    config = Qwen2Config(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_another_models_config_is_refused_before_anything_is_built(small_qwen_dir, tmp_path, monkeypatch):
    built = []
    import transformers

    monkeypatch.setattr(transformers.Qwen2ForCausalLM, "from_pretrained", lambda *a, **k: built.append(a))
    with pytest.raises(ValueError) as err:
        presets.load("qwen", path=small_qwen_dir, device="cpu")
    assert str(err.value).startswith(f"{small_qwen_dir / 'config.json'} is not Qwen/Qwen2.5-0.5B-Instruct's config: ")
    assert "hidden_size is 32, expected 896" in str(err.value) and "\n" not in str(err.value)
    # a GPT-2's folder (what once filled 10.7 GB building a default-size Qwen2 from it)
    gpt2 = shutil.copytree(small_qwen_dir, tmp_path / "gpt2")
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                                                   "n_embd": 768, "n_layer": 12, "vocab_size": 50257}))
    with pytest.raises(ValueError, match=r"model_type is 'gpt2', expected 'qwen2'; architectures is "
                                         r"\['GPT2LMHeadModel'\]"):
        presets.load("qwen", path=gpt2, device="cpu")
    (gpt2 / "config.json").write_text('{"model_type": "qwen2",')
    with pytest.raises(ValueError, match=r"config\.json is not a JSON config \(Expecting"):
        presets.load("qwen", path=gpt2, device="cpu")
    assert built == []


def test_loading_a_small_qwen2_is_refused_with_the_parameter_count(small_qwen_dir, monkeypatch):
    monkeypatch.setattr(presets, "check_qwen_config_file", lambda path: None)  # let it reach the built model
    with pytest.raises(ValueError) as err:
        presets.load("qwen", path=small_qwen_dir, device="cpu")
    message = str(err.value)
    assert message.startswith("not Qwen/Qwen2.5-0.5B-Instruct at revision 7ae557604adf67be50417f59c2c2f167def9a775")
    assert "config.hidden_size is 32, expected 896" in message
    small = 512 * 32 + (32 * 32 + 32) + 2 * (32 * 16 + 16) + 32 * 32 + 3 * 32 * 64 + 2 * 32 + 32
    assert f"{small:,} unique trainable parameters, expected 494,032,768" in message


def test_the_loading_path_gives_fp32_eager_eval_tied_without_tf32(small_qwen_dir, monkeypatch):
    checked = []
    monkeypatch.setattr(presets, "check_qwen", checked.append)  # let the small model through
    monkeypatch.setattr(presets, "check_qwen_config_file", lambda path: None)
    torch.backends.cuda.matmul.allow_tf32 = True
    model, tok = presets.load("qwen", path=small_qwen_dir, device="cpu")
    assert checked == [model]
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert model.dtype == torch.float32 and not model.training
    assert model.config._attn_implementation == "eager"
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tok.eos_token == "<|im_end|>"


def test_a_missing_folder_says_what_to_download_and_where(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as err:
        presets.load("qwen", path=tmp_path / "nowhere")
    message = str(err.value)
    for needed in ("Qwen/Qwen2.5-0.5B-Instruct", "7ae557604adf67be50417f59c2c2f167def9a775", "LABKIT_QWEN_DIR",
                   "hf download Qwen/Qwen2.5-0.5B-Instruct --revision "
                   "7ae557604adf67be50417f59c2c2f167def9a775 --local-dir", str(tmp_path / "nowhere"),
                   *presets.QWEN_FILES):
        assert needed in message, needed

    # Nothing named: the Hugging Face cache snapshot of that revision is where it looks.
    monkeypatch.delenv("LABKIT_QWEN_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / presets.QWEN_REVISION
    with pytest.raises(FileNotFoundError, match="Hugging Face cache"):
        presets.find_qwen_dir()
    snapshot.mkdir(parents=True)
    for name in presets.QWEN_REQUIRED_FILES:
        (snapshot / name).write_text("{}")
    assert presets.find_qwen_dir() == snapshot
    monkeypatch.setenv("LABKIT_QWEN_DIR", str(tmp_path / "elsewhere"))  # a named folder wins, and must be complete
    with pytest.raises(FileNotFoundError, match=r"\$LABKIT_QWEN_DIR"):
        presets.find_qwen_dir()


def test_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="unknown preset 'gpt2'"):
        presets.load("gpt2")


# -- tiny ------------------------------------------------------------------------------


def test_tiny_model_size_tying_and_spare_embedding_rows(tokenizer):
    model = presets.new_tiny_model(seed=0, tokenizer=tokenizer)
    # embedding 512*128 (tied, once); per layer q 128*128+128, k and v 128*64+64 (2 KV heads
    # of 32), o 128*128, MLP 3*128*512, two norms 128; final norm 128.
    per_layer = (128 * 128 + 128) + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 512 + 2 * 128
    assert presets.count_unique_parameters(model) == 512 * 128 + 4 * per_layer + 128 == 1_050_752
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.config.vocab_size == 512 > len(tokenizer) == 494


def test_tokenizer_facts_and_an_undecodable_id_is_lost_by_decode(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [491, 492, 493]
    assert tokenizer.eos_token_id == 493 and tokenizer.pad_token_id == 491
    # Id 500 is an embedding row with no token.  `decode` drops it without a word, so
    # decoded text alone cannot reveal it: samplers must check ids (id >= len(tokenizer),
    # or convert_ids_to_tokens giving None) before decoding.
    json_ids = tokenizer.encode('{"final_stock": 7}', add_special_tokens=False)
    assert tokenizer.decode(json_ids + [500]) == tokenizer.decode(json_ids) == '{"final_stock": 7}'
    assert tokenizer.convert_ids_to_tokens([500]) == [None]
    # Non-EOS specials stay in decoded text.
    assert tokenizer.decode([492, 493]) == "<|im_start|><|im_end|>"


def test_safetensors_round_trip_is_bitwise_and_keeps_tying(tmp_path, tokenizer):
    saved = presets.new_tiny_model(seed=3, tokenizer=tokenizer)
    path = presets.save_model(saved, tmp_path / "m.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
        assert f.metadata()["labkit_parameter_digest"] == presets.parameter_digest(saved)
    assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys  # the tied weight once

    other = presets.new_tiny_model(seed=4, tokenizer=tokenizer)
    assert presets.parameter_digest(other) != presets.parameter_digest(saved)
    presets.load_state_into(other, path)
    for (name, a), (_, b) in zip(saved.named_parameters(), other.named_parameters()):
        assert torch.equal(a, b), name
    assert other.lm_head.weight is other.model.embed_tokens.weight
    assert presets.parameter_digest(other) == presets.parameter_digest(saved)

    with torch.no_grad():  # one ulp anywhere changes the digest
        other.model.norm.weight[0] = torch.nextafter(other.model.norm.weight[0], torch.tensor(2.0))
    assert presets.parameter_digest(other) != presets.parameter_digest(saved)


def test_loading_a_state_of_another_shape_is_refused(tmp_path, tokenizer):
    small = Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    path = presets.save_model(small, tmp_path / "small.safetensors")
    with pytest.raises(ValueError, match=r"model.embed_tokens.weight is \(512, 32\)"):
        presets.load_state_into(presets.new_tiny_model(tokenizer=tokenizer), path)


def test_the_committed_base_loads_as_recorded_without_reseeding():
    manifest = read_json(presets.TINY_BASE_DIR / "manifest.json")
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    model, tok = presets.load("tiny")
    assert torch.equal(torch.rand(3), expected_next)  # loading did not touch the caller's RNG
    assert presets.parameter_digest(model) == manifest["parameter_digest"]
    assert model.dtype == torch.float32 and not model.training and str(model.device) == "cpu"
    assert model.config._attn_implementation == "eager"
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tok.eos_token_id == model.config.eos_token_id == 493


def test_tiny_state_argument_names_another_file(tmp_path, tokenizer):
    model = presets.new_tiny_model(seed=5, tokenizer=tokenizer)
    path = presets.save_model(model, tmp_path / "warm.safetensors")
    loaded, _ = presets.load("tiny", state=path)
    assert presets.parameter_digest(loaded) == presets.parameter_digest(model)
    with pytest.raises(FileNotFoundError, match="no tiny model state"):
        presets.load("tiny", state=tmp_path / "absent.safetensors")


def test_saved_model_bytes_do_not_depend_on_the_header_order(tmp_path):
    # safetensors writes its header from a hash map: two processes saving the same tensors could
    # order the metadata keys differently.  Build such a pair by hand and check both canonicalise
    # to the same bytes, which still load to the same tensors.
    import json

    from safetensors.torch import load, save

    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3, dtype=torch.int64)}
    raw = save(tensors, metadata={"format": "pt", "labkit_parameter_digest": "d"})
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    reordered = {"__metadata__": dict(reversed(list(header.pop("__metadata__").items()))), **header}
    text = json.dumps(dict(reversed(list(reordered.items())))).encode()
    text += b" " * (-len(text) % 8)
    shuffled = len(text).to_bytes(8, "little") + text + raw[8 + n :]
    assert shuffled != raw
    assert presets.canonical_safetensors(shuffled) == presets.canonical_safetensors(raw)
    back = load(presets.canonical_safetensors(shuffled))
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)

    model = presets.new_tiny_model(0, load_tiny_tokenizer())
    first, second = presets.save_model(model, tmp_path / "1.safetensors"), presets.save_model(model, tmp_path / "2.safetensors")
    assert first.read_bytes() == second.read_bytes()


def test_a_missing_or_damaged_tiny_tokenizer_is_named_with_the_way_to_restore_it(tmp_path):
    from labkit.models.tokenizer import ASSET_DIR

    with pytest.raises(FileNotFoundError, match=r"no tiny tokenizer at .*tokenizer\.json; it is committed with the "
                                                r"lab: restore it with `git checkout -- "):
        load_tiny_tokenizer(tmp_path)
    copy = shutil.copytree(ASSET_DIR, tmp_path / "tiny")
    text = (copy / "tokenizer.json").read_text()
    (copy / "tokenizer.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"tokenizer\.json cannot be read as a tokenizer \(.*\); restore it with"):
        load_tiny_tokenizer(copy)
