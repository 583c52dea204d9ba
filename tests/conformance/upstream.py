"""The upstream fixture of ``make conformance``: an MCP server on the official Python SDK.

It implements what the conformance suite's server scenarios ask for (the tool, prompt and
resource names their descriptions give), so that run alone it passes them; ``make
conformance`` then runs the same scenarios through ``callgate mcp --http`` in front of it.

``python -P tests/conformance/upstream.py --port PORT`` serves streamable HTTP on
127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import Message, UserMessage
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INTERNAL_ERROR,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    AudioContent,
    ClientCapabilities,
    Completion,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    InputRequiredResult,
    MissingRequiredClientCapabilityErrorData,
    PromptReference,
    ResourceTemplateReference,
    SamplingCapability,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel

# A 1x1 red PNG and a minimal WAV (RIFF header, no samples).
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIA"
    "X8jx0gAAAABJRU5ErkJggg=="
)
WAV = base64.b64encode(
    b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x44\xac\x00\x00"
    b"\x88X\x01\x00\x02\x00\x10\x00data\x00\x00\x00\x00"
).decode()


SLOW_CAP_S = 3.0
# How long the tools the tasks-* scenarios expect to be tasks work before they answer or
# ask: past callgate's 1 s threshold (ADR 0086), with room for a loaded machine.
WORK_S = 2.0


class Defaults(BaseModel):
    name: str = "John Doe"
    age: int = 30
    score: float = 95.5
    status: str = "active"
    verified: bool = True


class Username(BaseModel):
    username: str


def build() -> MCPServer:
    server = MCPServer("callgate-conformance-upstream")

    @server.tool()
    def test_simple_text() -> list[TextContent]:
        """Simple text."""
        return [TextContent(text="This is a simple text response for testing.")]

    @server.tool()
    def test_image_content() -> list[ImageContent]:
        """An image."""
        return [ImageContent(data=PNG, mime_type="image/png")]

    @server.tool()
    def test_audio_content() -> list[AudioContent]:
        """Audio."""
        return [AudioContent(data=WAV, mime_type="audio/wav")]

    @server.tool()
    def test_embedded_resource() -> list[EmbeddedResource]:
        """An embedded resource."""
        return [
            EmbeddedResource(
                resource=TextResourceContents(
                    uri="test://embedded-resource",
                    mime_type="text/plain",
                    text="This is an embedded resource content.",
                )
            )
        ]

    @server.tool()
    def test_multiple_content_types() -> list[Any]:
        """Text, image and resource."""
        return [
            TextContent(text="Multiple content types test:"),
            ImageContent(data=PNG, mime_type="image/png"),
            EmbeddedResource(
                resource=TextResourceContents(
                    uri="test://mixed-content-resource",
                    mime_type="application/json",
                    text='{"test":"data","value":123}',
                )
            ),
        ]

    @server.tool()
    async def test_tool_with_logging(ctx: Context) -> str:
        """Three log messages during the call."""
        await ctx.info("Tool execution started")
        await asyncio.sleep(0.05)
        await ctx.info("Tool processing data")
        await asyncio.sleep(0.05)
        await ctx.info("Tool execution completed")
        return "Tool with logging executed successfully"

    @server.tool()
    async def test_tool_with_progress(ctx: Context) -> str:
        """Progress 0, 50, 100 of 100."""
        for step in (0, 50, 100):
            await ctx.report_progress(step, 100)
            await asyncio.sleep(0.05)
        return "Tool with progress executed successfully"

    @server.tool()
    def test_error_handling() -> str:
        """Always fails."""
        raise ValueError("This tool intentionally returns an error for testing")

    @server.tool()
    async def test_sampling(prompt: str, ctx: Context) -> str:
        """Asks the client's model."""
        result = await ctx.session.create_message(
            messages=[SamplingMessage(role="user", content=TextContent(text=prompt))],
            max_tokens=100,
        )
        content = result.content
        text = content.text if isinstance(content, TextContent) else str(content)
        return f"LLM response: {text}"

    @server.tool()
    async def test_missing_capability(ctx: Context) -> str:
        """Needs the client's sampling: without it, the JSON-RPC error -32021 (SEP-2575)."""
        caps = ctx.session.client_capabilities
        if caps is None or caps.sampling is None:
            needed = ClientCapabilities(sampling=SamplingCapability())
            data = MissingRequiredClientCapabilityErrorData(required_capabilities=needed)
            raise MCPError(
                MISSING_REQUIRED_CLIENT_CAPABILITY,
                "This tool needs the client's sampling capability",
                data.model_dump(by_alias=True, mode="json", exclude_none=True),
            )
        return await test_sampling("Say hello.", ctx)

    @server.tool()
    async def test_elicitation(message: str, ctx: Context) -> str:
        """Asks the user."""
        result = await ctx.elicit(message, Username)
        return f"User response: action={result.action}, content={getattr(result, 'data', None)}"

    @server.tool()
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        """Elicitation with defaults for every primitive type."""
        schema = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "default": "John Doe"},
                "age": {"type": "integer", "default": 30},
                "score": {"type": "number", "default": 95.5},
                "status": {
                    "type": "string",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {"type": "boolean", "default": True},
            },
        }
        result = await ctx.session.elicit_form("Please review defaults", schema)
        return f"Elicitation completed: action={result.action}, content={result.content}"

    @server.tool()
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        """Elicitation with the five enum forms."""
        titled = [
            {"const": "value1", "title": "First Option"},
            {"const": "value2", "title": "Second Option"},
            {"const": "value3", "title": "Third Option"},
        ]
        schema = {
            "type": "object",
            "properties": {
                "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                "titledSingle": {"type": "string", "oneOf": titled},
                "legacyEnum": {
                    "type": "string",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                },
                "titledMulti": {"type": "array", "items": {"anyOf": titled}},
            },
        }
        result = await ctx.session.elicit_form("Please choose", schema)
        return f"Elicitation completed: action={result.action}, content={result.content}"

    @server.resource("test://static-text", mime_type="text/plain")
    def static_text() -> str:
        """Static text."""
        return "This is the content of the static text resource."

    @server.resource("test://static-binary", mime_type="image/png")
    def static_binary() -> bytes:
        """Static binary."""
        return base64.b64decode(PNG)

    @server.resource("test://template/{id}/data", mime_type="application/json")
    def template(id: str) -> str:
        """A templated resource."""
        return f'{{"id":"{id}","templateTest":true,"data":"Data for ID: {id}"}}'

    @server.resource("test://watched-resource", mime_type="text/plain")
    def watched() -> str:
        """A resource one can subscribe to."""
        return "Watched resource content"

    @server.prompt()
    def test_simple_prompt() -> list[Message]:
        """A prompt without arguments."""
        return [UserMessage("This is a simple prompt for testing.")]

    @server.prompt()
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[Message]:
        """A prompt with arguments."""
        return [UserMessage(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")]

    @server.prompt()
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[Message]:
        """A prompt with an embedded resource."""
        return [
            UserMessage(
                EmbeddedResource(
                    resource=TextResourceContents(
                        uri=resourceUri, mime_type="text/plain", text="Embedded resource content"
                    )
                )
            ),
            UserMessage("Please process the embedded resource above."),
        ]

    @server.prompt()
    def test_prompt_with_image() -> list[Message]:
        """A prompt with an image."""
        return [
            UserMessage(ImageContent(data=PNG, mime_type="image/png")),
            UserMessage("Please analyze the image above."),
        ]

    @server.completion()  # type: ignore[untyped-decorator,no-untyped-call]  # the SDK leaves it untyped
    async def complete(
        ref: PromptReference | ResourceTemplateReference, argument: Any, context: Any
    ) -> Completion:
        return Completion(values=["paris", "park", "party"], total=3, has_more=False)

    # 2026-07-28 input_required (SEP-2322): ask, then answer once the responses are there.
    def ask(ctx: Context, requests: dict[str, Any], state: str | None = None) -> Any:
        answered = ctx.input_responses or {}
        if all(k in answered for k in requests):
            return None
        return InputRequiredResult.model_validate(
            {"inputRequests": requests, **({"requestState": state} if state else {})}
        )

    def elicit(message: str, prop: str) -> dict[str, Any]:
        schema = {"type": "object", "properties": {prop: {"type": "string"}}, "required": [prop]}
        return {
            "method": "elicitation/create",
            "params": {"message": message, "requestedSchema": schema},
        }

    sample = {
        "method": "sampling/createMessage",
        "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": "Capital?"}}],
            "maxTokens": 100,
        },
    }
    roots = {"method": "roots/list", "params": {}}

    @server.tool()
    def test_input_required_result_elicitation(ctx: Context) -> InputRequiredResult | str:
        """Asks for a name."""
        return ask(ctx, {"user_name": elicit("What is your name?", "name")}) or "Hello!"

    @server.tool()
    def test_input_required_result_sampling(ctx: Context) -> InputRequiredResult | str:
        """Asks the client's model."""
        return ask(ctx, {"capital_question": sample}) or "The model answered."

    @server.tool()
    def test_input_required_result_list_roots(ctx: Context) -> InputRequiredResult | str:
        """Asks for the client's roots."""
        return ask(ctx, {"client_roots": roots}) or "Roots received."

    @server.tool()
    def test_input_required_result_request_state(ctx: Context) -> InputRequiredResult | str:
        """Round-trips its state."""
        asked = ask(ctx, {"confirm": elicit("Please confirm", "ok")}, "round-1")
        if asked is not None:
            return asked  # type: ignore[no-any-return]
        return "state-ok" if ctx.request_state == "round-1" else "state missing"

    @server.tool()
    def test_input_required_result_tampered_state(ctx: Context) -> InputRequiredResult | str:
        """Its state is sealed by the SDK; a tampered one is refused before this runs."""
        return ask(ctx, {"confirm": elicit("Please confirm", "ok")}, "sealed") or "state-ok"

    @server.tool()
    def test_input_required_result_multiple_inputs(ctx: Context) -> InputRequiredResult | str:
        """Three questions at once."""
        requests = {
            "user_name": elicit("What is your name?", "name"),
            "greeting": sample,
            "client_roots": roots,
        }
        return ask(ctx, requests, "multi") or "All inputs received."

    @server.tool()
    def test_input_required_result_multi_round(ctx: Context) -> InputRequiredResult | str:
        """Two rounds, the state changing between them."""
        if ctx.request_state != "round-2":
            asked = ask(ctx, {"step1": elicit("Step 1: What is your name?", "name")}, "round-1")
            if asked is not None:
                return asked  # type: ignore[no-any-return]
            return ask(ctx, {"step2": elicit("Step 2: Favorite color?", "color")}, "round-2")  # type: ignore[no-any-return]
        return ask(ctx, {"step2": elicit("Step 2: Favorite color?", "color")}, "round-2") or "Done."

    @server.tool()
    def test_input_required_result_capabilities(ctx: Context) -> InputRequiredResult | str:
        """Asks only for what the client declared."""
        caps = ctx.client_capabilities
        requests: dict[str, Any] = {}
        if caps is not None and caps.sampling is not None:
            requests["q"] = sample
        if caps is not None and caps.elicitation is not None:
            requests["e"] = elicit("Name?", "name")
        return (ask(ctx, requests) if requests else None) or "Nothing to ask."

    @server.prompt()
    def test_input_required_result_prompt(ctx: Context) -> InputRequiredResult | list[Message]:
        """A prompt that needs context first."""
        asked = ask(ctx, {"user_context": elicit("What context?", "context")})
        return asked or [UserMessage("Prompt with the given context.")]

    # The tasks-* scenarios' tools (SEP-2663): plain tools here. callgate in front of this
    # upstream answers a declaring client's call that has not settled quickly with a task
    # (ADR 0086); alone, this upstream serves no tasks.
    @server.tool()
    def greet(name: str = "World") -> str:
        """Sync-only."""
        return f"Hello, {name}!"

    @server.tool()
    async def slow_compute(seconds: float = 0, label: str = "") -> str:
        """Sleeps twice ``seconds``, then answers: a call of 1 s would race callgate's 1 s
        threshold for a task; at most SLOW_CAP_S, for the upstream's calls are never
        cancelled mid-way and a long one would hold the conformance run."""
        await asyncio.sleep(max(0.0, min(2 * seconds, SLOW_CAP_S)))
        return f"computed {label} after {seconds}s"

    @server.tool()
    async def failing_job() -> str:
        """A tool execution error after WORK_S."""
        await asyncio.sleep(WORK_S)
        raise ValueError("failing_job failed, as it always does")

    @server.tool()
    async def protocol_error_job() -> str:
        """A protocol-level (JSON-RPC) error after WORK_S."""
        await asyncio.sleep(WORK_S)
        raise MCPError(INTERNAL_ERROR, "protocol_error_job: an internal failure")

    # The task that asks: it works a while first, so callgate has made it a task
    # (ADR 0086) by the time it asks; it then asks the client through tasks/get.
    @server.tool()
    async def confirm_delete(ctx: Context, filename: str = "") -> InputRequiredResult | str:
        """Works WORK_S, asks to confirm (one elicitation), then answers."""
        if not ctx.input_responses:
            await asyncio.sleep(WORK_S)
        asked = ask(ctx, {"confirm": elicit(f"Delete {filename}?", "confirm")})
        return asked or f"Deleted {filename}."

    @server.tool()
    async def multi_input(ctx: Context) -> InputRequiredResult | str:
        """Works WORK_S, then asks two things at once."""
        if not ctx.input_responses:
            await asyncio.sleep(WORK_S)
        requests = {"first": elicit("First?", "name"), "second": elicit("Second?", "name")}
        return ask(ctx, requests) or "Both inputs received."

    @server.tool()
    async def test_tool_with_task(ctx: Context) -> InputRequiredResult | str:
        """Asks for a name (input_required), then works a while with it."""
        asked = ask(ctx, {"user_name": elicit("What is your name?", "name")})
        if asked is not None:
            return asked  # type: ignore[no-any-return]
        answer: Any = (ctx.input_responses or {})["user_name"]
        content = answer.get("content") if isinstance(answer, dict) else answer.content
        name = (content or {}).get("name", "nobody")
        await asyncio.sleep(WORK_S)
        return f"Hello, {name}!"

    low = server._lowlevel_server  # logging and subscriptions: MCPServer leaves them out

    async def set_level(ctx: Any, params: SetLevelRequestParams) -> EmptyResult:
        return EmptyResult()

    async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
        return EmptyResult()

    async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
        return EmptyResult()

    low.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
    low.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    ns = parser.parse_args()
    build().run("streamable-http", host="127.0.0.1", port=ns.port)


if __name__ == "__main__":
    main()
