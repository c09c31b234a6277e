"""ChatML renders for the turn-matching and proxy tests: SmolLM2's own tokenizer and template (ChatML),
a ChatML template that renders tools and tool calls the Hermes way, and one that drops the reasoning
of earlier assistant turns once a new user message arrives (as Qwen3's does), i.e. a template that
renders earlier turns differently from how the model saw them."""

from __future__ import annotations

from typing import Any

from support.smollm2_rig import smollm2_dir

# ChatML with tools: the tool list in the system turn, each call as <tool_call>{json}</tool_call>.
TOOLS_TEMPLATE = (
    "{% if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = 'You are a helpful assistant.' %}{% set rest = messages %}{% endif %}"
    "{{ '<|im_start|>system\\n' + system }}"
    "{% if tools %}{{ '\\n\\n# Tools\\n<tools>' }}{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\nCall a tool as <tool_call>\\n{\"name\": ..., \"arguments\": {...}}\\n</tool_call>' }}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% for m in rest %}"
    "{% if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{% for c in m.tool_calls or [] %}{% if m.content or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + (c.function.arguments | tojson)"
    " + '}\\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# ChatML that strips "<think>...</think>" from assistant turns older than the last user message.
THINKING_TEMPLATE = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% set content = m.content %}"
    "{% if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{{ '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir())


def render(tok: Any, messages: list[dict[str, Any]], *, template: str | None = None,
           tools: list[dict[str, Any]] | None = None) -> tuple[int, ...]:
    """What the proxy gives the generator for a chat request: the messages read as the server reads
    them (a tool call's JSON arguments as a dict), rendered with the generation prompt."""
    from rlvr.backends.serve.chat import chat_messages

    text = tok.apply_chat_template(chat_messages(messages), tools=tools, chat_template=template, tokenize=False,
                                   add_generation_prompt=True)
    return tuple(tok(text, add_special_tokens=False)["input_ids"])


class ScriptedGenerator:
    """A generator whose "model" answers ``reply(prompt_text)`` in the tokenizer's own tokens, then
    ``<|im_end|>`` (cut at the call's budget, as a real one); log-probs distinct per call and token.
    ``seen`` keeps each call's prompt ids, parameters and seed."""

    def __init__(self, tok: Any, reply: Any, version: int = 0):
        self.tok, self.reply, self.version = tok, reply, version
        self.im_end = tok.convert_tokens_to_ids("<|im_end|>")
        self.seen: list[tuple[tuple[int, ...], Any, int]] = []

    async def generate(self, prompt_ids: Any, params: Any, *, seed: int) -> Any:
        from rlvr.types import Completion, StopReason

        self.seen.append((tuple(prompt_ids), params, seed))
        text = self.reply(self.tok.decode(list(prompt_ids), skip_special_tokens=False))
        ids = (*self.tok(text, add_special_tokens=False)["input_ids"], self.im_end)
        stop = StopReason.STOP
        if len(ids) > params.max_tokens:
            ids, stop = ids[:params.max_tokens], StopReason.LENGTH
        n = len(self.seen)
        return Completion(ids, tuple(-n - k / 100 for k in range(len(ids))), stop, self.version)
