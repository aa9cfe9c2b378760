#!/usr/bin/env python3
"""Regenerate crates/tokenizer/tests/fixtures/chat_templates.json.

Two references, neither written here:

* Jinja chat templates are rendered the way transformers' `apply_chat_template(...,
  tokenize=False)` renders them: messages normalized by `_normalize_chat_messages` (keys whose
  value is None dropped), then `render_jinja_template` with the special tokens as keyword
  arguments. If transformers is not importable, the same environment is rebuilt on plain jinja2
  (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, HF's tojson /
  raise_exception / strftime_now / namespace) -- see `_fallback_render`.
  `strftime_now` is pinned to FIXED_NOW so the output is reproducible.
* llama.cpp's built-in (non-Jinja) formats come from `llama_cpp.llama_chat_apply_template`
  (llama-cpp-python 0.3.36), both by built-in name and by llama.cpp's detection from a template
  source.

Templates are read from crates/tokenizer/tests/fixtures/chat_templates/*.jinja (the
`tokenizer.chat_template` of the model repos named by the file names, as collected in llama.cpp's
models/templates/ directory; Gemma 3's from google/gemma-3-*-it tokenizer_config.json;
synthetic-python-features.jinja is written for this fixture).

Usage:
    pip install transformers jinja2 llama-cpp-python==0.3.36   # transformers optional
    python3 scripts/chat_template_reference.py
"""

import ctypes
import datetime as _dt
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "crates", "tokenizer", "tests", "fixtures")
TEMPLATE_DIR = os.path.join(FIXTURES, "chat_templates")
OUT = os.path.join(FIXTURES, "chat_templates.json")

# The clock `strftime_now` sees (UTC); the Rust test pins the same instant.
FIXED_NOW = _dt.datetime(2025, 3, 7, 9, 5, 3)

# bos/eos as each model's tokenizer_config.json declares them ("" where it declares none).
TEMPLATES = {
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "Qwen-QwQ-32B": ("", "<|im_end|>"),
    "Qwen3-Coder": ("", "<|im_end|>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "google-gemma-3-it": ("<bos>", "<eos>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("<s>", "</s>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": (
        "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
    ),
    "deepseek-ai-DeepSeek-V3.1": (
        "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
    ),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "HuggingFaceTB-SmolLM3-3B": ("", "<|im_end|>"),
    "ibm-granite-granite-3.3-2B-Instruct": ("<|end_of_text|>", "<|end_of_text|>"),
    "openai-gpt-oss-120b": ("<|startoftext|>", "<|return|>"),
    # Written for this fixture: Python string/dict methods, tojson options, loop controls,
    # namespace, how values print.
    "synthetic-python-features": ("<s>", "</s>"),
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location (°C or °F)",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and country, e.g. Paris, France",
                    },
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web & return <b>snippets</b>",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "max_results": {"type": "integer", "default": 5},
                },
                "required": ["query"],
            },
        },
    },
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CALL = {
    "id": "abc123XYZ",
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "arguments": {"location": "Paris, France", "unit": "celsius"},
    },
}
CALL_STR_ARGS = {
    "id": "def456UVW",
    "type": "function",
    "function": {"name": "search", "arguments": "{\"query\": \"météo Paris\"}"},
}

CONVERSATIONS = {
    "plain": {"messages": [{"role": "user", "content": "Hello! How are you?"}]},
    "system": {"messages": [SYSTEM, {"role": "user", "content": "What is 2+2?"}]},
    "multi_turn": {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Hi <b>there</b> & 'friends' \"quoted\""},
            {"role": "assistant", "content": "  Hello! 日本語 🙂  "},
            {"role": "user", "content": "Tell me a joke.\n"},
        ]
    },
    "content_parts": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe"},
                    {"type": "text", "text": " this, please."},
                ],
            }
        ]
    },
    "tools_no_call": {
        "tools": TOOLS,
        "messages": [SYSTEM, {"role": "user", "content": "What's the weather in Paris?"}],
    },
    "tools_call_result": {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {
                "role": "tool",
                "tool_call_id": "abc123XYZ",
                "name": "get_current_weather",
                "content": "{\"temperature\": 22, \"unit\": \"celsius\"}",
            },
        ],
    },
    "tools_single_call": {
        "tools": TOOLS,
        "messages": [
            SYSTEM,
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {
                "role": "tool",
                "tool_call_id": "abc123XYZ",
                "name": "get_current_weather",
                "content": "{\"temperature\": 22, \"unit\": \"celsius\"}",
            },
            {"role": "assistant", "content": "It is 22 °C in Paris."},
            {"role": "user", "content": "And in Rome?"},
        ],
    },
    "tools_full": {
        "tools": TOOLS,
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Weather in Paris, and search for news?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL, CALL_STR_ARGS]},
            {
                "role": "tool",
                "tool_call_id": "abc123XYZ",
                "name": "get_current_weather",
                "content": "22 degrees",
            },
            {"role": "tool", "tool_call_id": "def456UVW", "name": "search", "content": "No news."},
            {"role": "assistant", "content": "It is 22 °C in Paris; no news."},
            {"role": "user", "content": "Thanks!"},
        ],
    },
    "thinking_history": {
        "messages": [
            {"role": "user", "content": "What is 1+1?"},
            {"role": "assistant", "content": "2", "reasoning_content": "Simple arithmetic."},
            {"role": "user", "content": "And 2+2?"},
        ]
    },
    "think_in_content": {
        "messages": [
            {"role": "user", "content": "What is 1+1?"},
            {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\nIt is 2."},
        ]
    },
}

# (conversation, add_generation_prompt, kwargs)
CASES = []
for conv in CONVERSATIONS:
    CASES.append((conv, True, {}))
for conv in ("plain", "multi_turn", "tools_single_call", "tools_full", "think_in_content"):
    CASES.append((conv, False, {}))
for conv in ("plain", "thinking_history", "tools_call_result"):
    CASES.append((conv, True, {"enable_thinking": True}))
    CASES.append((conv, True, {"enable_thinking": False}))
CASES.append(("plain", True, {"reasoning_effort": "high", "custom_flag": [1, 2.5, None]}))


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


def _transformers_renderer():
    from transformers.utils import chat_template_utils as ctu

    ctu.datetime = _FixedDatetime

    def render(template, messages, tools, add_generation_prompt, kwargs):
        messages = ctu._normalize_chat_messages(messages)
        out, _ = ctu.render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        return out[0]

    import transformers

    return render, "transformers " + transformers.__version__


def _fallback_renderer():
    # transformers' environment, rebuilt (transformers/utils/chat_template_utils.py).
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    def render(template, messages, tools, add_generation_prompt, kwargs):
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        env.globals["namespace"] = jinja2.utils.Namespace
        chat = []
        for m in messages:
            m = {k: v for k, v in m.items() if v is not None}
            r = next(
                (m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None),
                None,
            )
            if r is not None:
                m = {"thinking": r, **m, "reasoning_content": r}
            chat.append(m)
        return env.from_string(template).render(
            messages=chat,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )

    return render, "jinja2 " + jinja2.__version__ + " (transformers environment rebuilt)"


def jinja_cases(render):
    out = []
    for name, (bos, eos) in TEMPLATES.items():
        with open(os.path.join(TEMPLATE_DIR, name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
        for conv, agp, kwargs in CASES:
            spec = CONVERSATIONS[conv]
            full_kwargs = {"bos_token": bos, "eos_token": eos, **kwargs}
            case = {
                "template": name,
                "conversation": conv,
                "add_generation_prompt": agp,
                "kwargs": kwargs,
            }
            try:
                case["expected"] = render(
                    template, json.loads(json.dumps(spec["messages"])), spec.get("tools"), agp,
                    full_kwargs,
                )
            except Exception as e:  # the template rejects this conversation
                case["error"] = f"{type(e).__name__}: {e}"
            out.append(case)
    return out


def llama_cpp_apply(tmpl, messages, add_ass):
    import llama_cpp

    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role = role
        arr[i].content = content
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(tmpl.encode(), arr, len(messages), add_ass, buf, size)
    if n < 0:
        return None
    return buf.raw[:n].decode("utf-8")


BUILTIN_NAMES = [
    "chatml", "gemma", "llama3", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip",
    "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3",
    "zephyr", "deepseek3", "granite", "gpt-oss",
]
BUILTIN_CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hello"}],
    "system": [
        {"role": "system", "content": "  Be brief. "},
        {"role": "user", "content": " Hi there\n"},
    ],
    "multi_turn": [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "  Hi there 🙂 "},
        {"role": "user", "content": "Who are you"},
        {"role": "assistant", "content": "   I am an assistant   "},
        {"role": "user", "content": "Another question"},
    ],
    "two_systems": [
        {"role": "system", "content": "First."},
        {"role": "system", "content": "Second."},
        {"role": "user", "content": "Go"},
    ],
}


def builtin_cases():
    out = []
    for name in BUILTIN_NAMES:
        for conv, messages in BUILTIN_CONVERSATIONS.items():
            for add_ass in (True, False):
                expected = llama_cpp_apply(name, messages, add_ass)
                assert expected is not None, name
                out.append(
                    {"name": name, "conversation": conv, "add_generation_prompt": add_ass,
                     "expected": expected}
                )
    return out


def detection_cases():
    # llama.cpp's template detection over each real template, rendered on one conversation.
    out = []
    for name in TEMPLATES:
        with open(os.path.join(TEMPLATE_DIR, name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
        out.append(
            {"template": name, "conversation": "multi_turn",
             "expected": llama_cpp_apply(template, BUILTIN_CONVERSATIONS["multi_turn"], True)}
        )
    return out


STRFTIME_FORMAT = (
    "%a %A %b %B %c|%C %d %-d %D %e %f %F %h %H %-H %I %j %-j %k %l %m %-m %M %n%p %P %r %R %S "
    "%t%T %u %w %x %X %y %Y [%z%Z] %% %Q"
)
STRFTIME_INSTANTS = [
    0, 951782400.5, 951868799, 1078012800, 1709251199.25, 1741338303, 1767225599, 4102444800,
    -86400 * 365,
]


def strftime_cases():
    # Python's strftime on the naive UTC date-time, as strftime_now's datetime.now() is naive.
    out = []
    for t in STRFTIME_INSTANTS:
        d = _dt.datetime.fromtimestamp(t, _dt.timezone.utc).replace(tzinfo=None)
        micros = round(t * 1_000_000)
        for fmt in (STRFTIME_FORMAT, "%d %b %Y", "%Y-%m-%d", "%-d %B %Y"):
            out.append({"unix_micros": micros, "format": fmt, "expected": d.strftime(fmt)})
    return out


def main():
    try:
        render, renderer = _transformers_renderer()
    except ImportError:
        render, renderer = _fallback_renderer()
    import llama_cpp

    doc = {
        "generated_by": "scripts/chat_template_reference.py",
        "renderer": renderer,
        "llama_cpp_python": llama_cpp.__version__,
        "fixed_now": FIXED_NOW.isoformat(),
        "fixed_now_unix": int(FIXED_NOW.replace(tzinfo=_dt.timezone.utc).timestamp()),
        "strftime_cases": strftime_cases(),
        "templates": {name: {"bos": b, "eos": e} for name, (b, e) in TEMPLATES.items()},
        "conversations": CONVERSATIONS,
        "cases": jinja_cases(render),
        "builtin_conversations": BUILTIN_CONVERSATIONS,
        "builtin_cases": builtin_cases(),
        "detection_cases": detection_cases(),
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in c for c in doc["cases"])
    print(f"{OUT}: {len(doc['cases'])} template cases ({n_err} rejected by the template), "
          f"{len(doc['builtin_cases'])} built-in cases, renderer {renderer}", file=sys.stderr)


if __name__ == "__main__":
    main()
