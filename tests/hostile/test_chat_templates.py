"""Chat templates from a model file are untrusted code: however costly, rendering one ends within
the time bound with a result or a DiffuseError naming the template and the file, and real
templates render exactly as an unguarded sandbox renders them.

Hostile inputs: nested loops 6, huge repetition 14, recursion 5, huge output 5, slow filters 5,
huge format widths 5 (40 in all); benign templates 8, each on 3 chats, compared with jinja2's
plain sandbox.
"""
from __future__ import annotations

import threading
import time

import pytest
from fixtures.tiny_models import DREAM_CHAT_TEMPLATE, LLADA_CHAT_TEMPLATE
from hostile_models import tiny_tokenizer_json, tokenizer_gguf
from jinja2.sandbox import ImmutableSandboxedEnvironment

from diffuse import DiffuseError
from diffuse.tokenizer import TEMPLATE_SECONDS, Tokenizer

TIMEOUT_S = 60
SLACK_S = 4.0   # the bound is TEMPLATE_SECONDS; the rest is a loaded two-core CI machine
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"}, {"role": "user", "content": "how are you?"}]

NESTED_LOOPS = {
    "range_x_range": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "list_x_list": "{% set xs = range(100000)|list %}{% for a in xs %}{% for b in xs %}{% endfor %}{% endfor %}",
    "messages_cubed": "{% set xs = messages * 1000 %}{% for a in xs %}{% for b in xs %}{% for c in xs %}"
                      "{% endfor %}{% endfor %}{% endfor %}",
    "loop_with_body": "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
    "string_chars": "{% for c in 'x' * 1000000 %}{% for d in 'y' * 1000000 %}{% endfor %}{% endfor %}",
    "loop_if_filter": "{% for i in range(100000) if i is odd %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
}
REPETITION = {
    "str_times_huge": "{{ 'x' * 10**13 }}",
    "str_times_literal": "{{ 'x' * 10000000000000 }}",
    "list_times_huge": "{{ [0] * 10**10 }}",
    "int_times_str": "{{ 10**9 * 'ab' }}",
    "just_over": "{{ 'ab' * 600000 }}",
    "big_power": "{{ 2 ** 100000000 }}",
    "squaring": "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    "tilde_doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "plus_doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "replace_doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                        "{% set ns.s = ns.s|replace('x', 'xx') %}{% endfor %}",
    "str_replace_method": "{{ ('x' * 100000).replace('x', 'y' * 100) }}",
    "join_wide_separator": "{{ ('-' * 100000).join(range(1000)|list) }}",
    "indent_many_lines": "{{ ('\n' * 100000)|indent(1000) }}",
    "indent_float_width": "{{ 'a\nb'|indent(1e12) }}",
}
RECURSION = {
    "self_recursive_macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "mutual_recursion": "{% macro f(n) %}{{ g(n) }}{% endmacro %}{% macro g(n) %}{{ f(n) }}{% endmacro %}{{ f(0) }}",
    "fan_out": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "recursive_loop": "{% for x in [1, 2] recursive %}{{ loop([1, 2]) }}{% endfor %}",
    "deep_parens": "{{ " + "(" * 100000 + "1" + ")" * 100000 + " }}",
}
HUGE_OUTPUT = {
    "loop_of_big_strings": "{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}",
    "set_block": "{% set x %}{% for i in range(100000) %}{{ 'z' * 1000 }}{% endfor %}{% endset %}{{ x|length }}",
    "macro_buffer": "{% macro big() %}{% for i in range(100000) %}{{ 'z' * 1000 }}{% endfor %}{% endmacro %}"
                    "{{ big()|length }}",
    "tojson_big_list": "{{ (range(100000)|list * 10)|tojson }}",
    "many_messages": "{% for i in range(100000) %}{% for m in messages %}{{ m.content * 100 }}{% endfor %}{% endfor %}",
}
SLOW_FILTERS = {
    "wordwrap_width_1": "{{ ('x' * 1000000)|wordwrap(1) }}",
    "urlize_long": "{{ ('http://a.b/c ' * 50000)|urlize }}",
    "sum_in_loop": "{% for i in range(100000) %}{{ range(100000)|sum }}{% endfor %}",
    "sort_in_loop": "{% set xs = range(100000)|list|reverse|list %}{% for i in xs %}{{ (xs|sort)[0] }}{% endfor %}",
    "center_huge": "{{ 'x'|center(1000000000) }}",
}
WIDTHS = {   # format strings are also "slow": a width allocates before anything can look at it
    "percent_width": "{{ '%999999999d' % 1 }}",
    "percent_star": "{{ '%*d' % (999999999, 1) }}",
    "format_width": "{{ '{:>999999999}'.format(1) }}",
    "format_nested_width": "{{ '{:{}}'.format(1, 999999) }}",
    "ljust": "{{ 'x'.ljust(1000000000) }}",
}
HOSTILE = {**NESTED_LOOPS, **REPETITION, **RECURSION, **HUGE_OUTPUT, **SLOW_FILTERS, **WIDTHS}

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
          " + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
BENIGN = {
    "llama3": LLAMA3,
    "chatml": CHATML,
    "llada_checkpoint": LLADA_CHAT_TEMPLATE,
    "dream_checkpoint": DREAM_CHAT_TEMPLATE,
    "namespace_system": "{% set ns = namespace(system='') %}{% for m in messages %}{% if m.role == 'system' %}"
                        "{% set ns.system = ns.system ~ m.content %}{% endif %}{% endfor %}[{{ ns.system }}]"
                        "{% for m in messages if m.role != 'system' %}{{ m.role|upper }}: {{ m.content }}"
                        "{% if not loop.last %}\n{% endif %}{% endfor %}",
    "macro_and_filters": "{% macro turn(m) %}<{{ m.role }}>{{ m.content|trim|replace('\n', ' ') }}</{{ m.role }}>"
                         "{% endmacro %}{% for m in messages %}{{ turn(m) }}{% endfor %}{{ messages|length }}"
                         "{{ messages|map(attribute='role')|join(',') }}{{ '%s/%d' % ('n', 3) }}",
    "recursive_tree": "{% for x in [[1, [2, [3, [4]]]], 5] recursive %}{% if x is iterable %}({{ loop(x) }})"
                      "{% else %}{{ x }}{% endif %}{% endfor %}",
    "tojson_and_format": "{{ messages|tojson }}{{ '{}: {}'.format('a', 1) }}{{ 'x'|center(9) }}",
}


def plain_render(template: str, messages: list[dict]) -> str:
    """What the template renders to with jinja2's sandbox alone (the settings the tokenizer uses)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token="<|endoftext|>", eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def tokenizer_json() -> str:
    return tiny_tokenizer_json()


def load(tmp_path, tokenizer_json: str, template: str) -> Tokenizer:
    path = tokenizer_gguf(tmp_path / "hostile.gguf", tokenizer_json=tokenizer_json, chat_template=template,
                          kv={"tokenizer.ggml.bos_token_id": 36}, kv_types={"tokenizer.ggml.bos_token_id": "u32"})
    return Tokenizer.for_model(path)


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_template_is_refused_in_time(tmp_path, tokenizer_json, name):
    tok = load(tmp_path, tokenizer_json, HOSTILE[name])
    start = time.monotonic()
    with pytest.raises(DiffuseError, match=r"hostile\.gguf.*chat template"):
        tok.apply_chat_template(CHAT)
    assert time.monotonic() - start < TEMPLATE_SECONDS + SLACK_S
    with pytest.raises(DiffuseError, match="chat template"):   # the studio's later turns, and encode_chat
        tok.encode_chat("again")


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", BENIGN)
def test_benign_template_renders_as_before(tmp_path, tokenizer_json, name):
    tok = load(tmp_path, tokenizer_json, BENIGN[name])
    assert tok.id_to_token(36) == "<|endoftext|>"
    for messages in (CHAT, CHAT * 100, [{"role": "user", "content": "long " * 200000}]):
        assert tok.apply_chat_template(messages) == plain_render(BENIGN[name], messages)


@pytest.mark.timeout(TIMEOUT_S)
def test_template_errors_and_oversized_source(tmp_path, tokenizer_json):
    tok = load(tmp_path, tokenizer_json, "{{ raise_exception('only user turns') }}")
    with pytest.raises(DiffuseError, match="chat template failed.*only user turns"):
        tok.apply_chat_template(CHAT)
    tok = load(tmp_path, tokenizer_json, "{{ 1 / 0 }}{{ messages[99] }}")
    with pytest.raises(DiffuseError, match="chat template failed: ZeroDivisionError"):
        tok.apply_chat_template(CHAT)
    tok = load(tmp_path, tokenizer_json, "{% for %}")
    with pytest.raises(DiffuseError, match="chat template is invalid"):
        tok.apply_chat_template(CHAT)
    tok = load(tmp_path, tokenizer_json, "x" * (2 << 20))
    with pytest.raises(DiffuseError, match="chat template has 2097152 characters"):
        tok.apply_chat_template(CHAT)


@pytest.mark.timeout(TIMEOUT_S)
def test_bounds_are_per_render_and_per_thread(tmp_path, tokenizer_json):
    """A refused render leaves nothing behind: the same template renders a small chat next time,
    also while another thread renders."""
    tok = load(tmp_path, tokenizer_json, "{% for m in messages %}{% for i in range(10000) %}{% endfor %}"
                                         "{{ m.content }}{% endfor %}")
    with pytest.raises(DiffuseError, match="loop iterations"):
        tok.apply_chat_template(CHAT * 50)
    results = []
    threads = [threading.Thread(target=lambda: results.append(tok.apply_chat_template(CHAT))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["Be brief.hellohihow are you?"] * 4
