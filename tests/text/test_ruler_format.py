"""RULER-format mode: RULER's per-model template around the task text, answer prefix appended, as RULER's
`prepare.py` composes it; recorded with the instance and part of its id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longeval.config import ModelConfig
from longeval.errors import ConfigError
from longeval.tasks import get_task
from longeval.tasks.base import GenContext, instance_rng, make_instance, output_budget
from longeval.text.render import PromptFormat, prompt_format, render_frame, render_messages
from longeval.text.ruler_format import RULER_MODEL_TEMPLATES
from longeval.text.tokenizer import Encoder, load_encoder
from tests.text.test_render import Wrapped


@pytest.fixture(scope="module")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


def _niah(fmt: PromptFormat, encoder: Encoder, length: int = 2048):
    ctx = GenContext(encoder=encoder, fmt=fmt)
    spec = get_task("ruler/niah_single_1")
    draft = spec.generate(ctx, spec.params, target_length=length, max_new_tokens=output_budget(spec, fmt, length),
                          rng=instance_rng(7, spec.key, length, 0), index=0)
    return make_instance(spec, draft, ctx, target_length=length, seed=7, shard_index=0, index=0)


def test_the_prompt_is_rulers_template_filled_by_hand(encoder: Encoder) -> None:
    inst = _niah(PromptFormat(ruler_template="meta-chat"), encoder)
    query = json.loads(inst.meta)["keys"][0]
    start = "number afterwards.\n"
    context = inst.prompt[inst.prompt.index(start) + len(start) : inst.prompt.index("\nWhat is the special")]
    # RULER: Templates['meta-chat'].format(task_template=<niah template>) + <niah answer prefix>, rewritten to the
    # singular for one query and one value (scripts/data/synthetic/niah.py), then .format(...)
    expected = (
        "[INST] A special magic number is hidden within the following text. Make sure to memorize it. "
        f"I will quiz you about the number afterwards.\n{context}\nWhat is the special magic number for "
        f"{query} mentioned in the provided text? [/INST] The special magic number for {query} mentioned in "
        "the provided text is"
    )
    assert inst.prompt == expected
    assert "<|im_start|>" not in inst.prompt  # the model's own chat template is not used
    assert list(inst.prompt_token_ids) == encoder.tokenizer.encode(inst.prompt, add_special_tokens=False)
    assert 0.99 * 2048 <= inst.input_tokens + inst.max_new_tokens <= 2048
    assert json.loads(inst.meta)["prompt_format"]["ruler_template"] == "meta-chat"


def test_the_format_is_part_of_the_instance_id(encoder: Encoder) -> None:
    ids = {_niah(fmt, encoder).instance_id for fmt in (PromptFormat(), PromptFormat(ruler_template="base"),
                                                       PromptFormat(ruler_template="meta-chat"))}
    assert len(ids) == 3
    assert "ruler_template" not in PromptFormat().identity()  # chat-format ids did not change


def test_the_tokenizers_bos_is_added_once(encoder: Encoder) -> None:
    """RULER sends text and the engine adds BOS; a template that starts with it does not get a second."""
    with_bos = Encoder(Wrapped(encoder.tokenizer, bos=1))
    plain = render_frame(with_bos, PromptFormat(ruler_template="base"), "Read.\n{context}\nQ?", " A:")
    assert plain.head_ids.tolist()[:1] == [1] and plain.head_ids.tolist()[1:2] != [1]
    assert plain.tail.endswith("Q? A:")
    led = render_frame(with_bos, PromptFormat(ruler_template="base"), "<|im_start|>Read.\n{context}\nQ?", " A:")
    assert led.head_ids.tolist()[:2] == [1] + with_bos.encode("Read.").tolist()[:1]


def test_model_config_selects_the_format() -> None:
    model = ModelConfig(name="m", path="p", prompt_format="ruler", ruler_template="Phi3")
    assert prompt_format(model) == PromptFormat(ruler_template="Phi3")
    assert prompt_format(ModelConfig(name="m", path="p", ruler_template="Phi3")).ruler_template is None
    with pytest.raises(ConfigError, match="choices: chat, ruler"):
        prompt_format(ModelConfig(name="m", path="p", prompt_format="helmet"))
    with pytest.raises(ConfigError, match="meta-llama3"):
        PromptFormat(ruler_template="llama3")
    with pytest.raises(ConfigError, match="system"):
        PromptFormat(ruler_template="base", system_prompt="Be brief.")
    assert set(RULER_MODEL_TEMPLATES) >= {"base", "meta-chat", "meta-llama3", "Phi3"}


def test_a_conversation_cannot_go_through_rulers_single_turn_templates(encoder: Encoder) -> None:
    with pytest.raises(ConfigError, match="layout=text"):
        render_messages(encoder, PromptFormat(ruler_template="base"), [{"role": "user", "content": "hi"}])
