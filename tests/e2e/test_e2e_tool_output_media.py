"""Images and files a tool returns, through the real proxy with the openai SDK, from the
Responses API to a chat-completions and an Anthropic upstream: chat's ``tool`` messages take
text only, so what a ``function_call_output`` (or ``custom_tool_call_output``) returns beside
its text goes, labelled with its call, in one user message after the round's tool messages
(on Anthropic: in the user turn of the tool_result blocks, after them); a part neither
upstream can read is a 400 in the Responses shape, never dropped."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, oai

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
IMAGE_URL = f"data:image/png;base64,{PNG}"
PDF = "data:application/pdf;base64,JVBERi0xLjQK"
SHOT: dict[str, Any] = {
    "type": "function",
    "name": "screenshot",
    "parameters": {"type": "object", "properties": {}},
}


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> Proxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, "--mode", "passthrough", config={"upstreams": [up]})


def call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "screenshot", "arguments": "{}"}


def shot_output(call_id: str, caption: str) -> dict[str, Any]:
    """A function_call_output as Codex's view_image and computer-use tools send one."""
    return {
        "type": "function_call_output",
        "call_id": call_id,
        "output": [
            {"type": "input_text", "text": caption},
            {"type": "input_image", "image_url": IMAGE_URL, "detail": "high"},
        ],
    }


def ask(p: Proxy, items: list[Any], session: str) -> Any:
    c = oai(p, default_headers={SESSION_HEADER: session})
    return c.responses.with_raw_response.create(
        model="gpt-5",
        input=items,
        tools=[SHOT],  # type: ignore[list-item]
    )


USER = {"role": "user", "content": "What is on the screen?"}


def test_tool_images_follow_the_tool_messages_on_a_chat_upstream(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai")
    fake.enqueue(Reply(text="Two windows."))
    items = [USER, call("c1"), call("c2"), shot_output("c1", "left"), shot_output("c2", "right")]
    raw = ask(p, items, "media-chat")
    assert raw.parse().output_text == "Two windows."
    assert "x-skillstate-dropped-items" not in raw.headers
    msgs = fake.last.json["messages"]
    assert msgs[1]["tool_calls"][1]["id"] == "c2"
    assert msgs[2:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "left"},
        {"role": "tool", "tool_call_id": "c2", "content": "right"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "[image(s) returned by tool call c1]"},
                {"type": "image_url", "image_url": {"url": IMAGE_URL, "detail": "high"}},
                {"type": "text", "text": "[image(s) returned by tool call c2]"},
                {"type": "image_url", "image_url": {"url": IMAGE_URL, "detail": "high"}},
            ],
        },
    ]


def test_a_round_with_tool_images_keeps_its_order_before_the_next_prompt(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The images of a round go before what follows it (a new prompt, the next round's
    calls), a file as chat's file part."""
    p = start(fake, start_proxy, "openai")
    fake.enqueue(Reply(text="Done."))
    pdf_out = {
        "type": "function_call_output",
        "call_id": "c2",
        "output": [{"type": "input_file", "file_data": PDF, "filename": "r.pdf"}],
    }
    items = [USER, call("c1"), shot_output("c1", "one"), call("c2"), pdf_out, USER]
    ask(p, items, "media-order")
    msgs = fake.last.json["messages"]
    roles = [m["role"] for m in msgs]
    assert roles == ["user", "assistant", "tool", "user", "assistant", "tool", "user", "user"]
    assert msgs[3]["content"][1]["type"] == "image_url"
    assert msgs[5] == {"role": "tool", "tool_call_id": "c2", "content": ""}
    assert msgs[6]["content"][1] == {
        "type": "file",
        "file": {"file_data": PDF, "filename": "r.pdf"},
    }
    assert msgs[7] == {"role": "user", "content": USER["content"]}


def test_tool_images_reach_an_anthropic_upstream_in_the_tool_results_turn(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "anthropic")
    fake.enqueue(Reply(text="A terminal."))
    raw = ask(p, [USER, call("c1"), shot_output("c1", "screen")], "media-anthropic")
    assert raw.parse().output_text == "A terminal."
    turn = fake.last.json["messages"][-1]
    assert turn == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "screen"},
            {"type": "text", "text": "[image(s) returned by tool call c1]"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ],
    }


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("part", "where"),
    [
        ({"type": "input_image", "file_id": "file-abc"}, "input[2].output[1]"),
        ({"type": "input_file", "file_url": "https://example.com/a.pdf"}, "input[2].output[1]"),
    ],
    ids=["image-by-file-id", "file-by-url"],
)
def test_a_tool_output_part_no_upstream_form_holds_is_a_400(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, part: dict[str, Any], where: str
) -> None:
    p = start(fake, start_proxy, kind)
    out = {
        "type": "function_call_output",
        "call_id": "c1",
        "output": [{"type": "input_text", "text": "x"}, part],
    }
    with pytest.raises(openai.BadRequestError) as e:
        ask(p, [USER, call("c1"), out], f"media-bad-{kind}")
    assert e.value.status_code == 400
    assert isinstance(e.value.body, dict) and e.value.body.get("param") == where
    assert fake.requests == []


def test_an_image_in_a_user_message_by_file_id_is_a_400_not_dropped(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai")
    user = {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "file_id": "file-abc"},
        ],
    }
    with pytest.raises(openai.BadRequestError) as e:
        ask(p, [user], "media-user")
    assert isinstance(e.value.body, dict) and e.value.body.get("param") == "input[0].content[1]"
    assert fake.requests == []
