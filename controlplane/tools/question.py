"""`question`: asks the user and waits (over the call's stream, or answered from another connection).

It asks no permission: the `question` permission only decides whether the tool is shown.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from controlplane.core.calls.tool import InitContext, ToolContext, ToolDefinition, ToolError, ToolInfo, ToolResult
from controlplane.core.definitions.schema import parameters_schema
from controlplane.tools.describe import description


class QuestionOption(BaseModel):
    label: str = Field(description="Display text (1-5 words, concise)")
    description: str = Field(description="Explanation of choice")


class QuestionItem(BaseModel):
    question: str = Field(description="Complete question")
    header: str = Field(description="Very short label (max 30 chars)")
    options: list[QuestionOption] = Field(description="Available choices")
    multiple: bool | None = Field(default=None, description="Allow selecting multiple choices")


class QuestionParams(BaseModel):
    questions: list[QuestionItem] = Field(description="Questions to ask")


def _schema() -> dict[str, Any]:
    """Upstream's option schema carries zod metadata (`ref`), which zod emits first in the object."""
    schema = parameters_schema(QuestionParams)
    options = schema["properties"]["questions"]["items"]["properties"]["options"]
    options["items"] = {"ref": "QuestionOption", **options["items"]}
    return schema


async def ask(ctx: ToolContext, questions: list[dict[str, Any]]) -> list[list[str]]:
    """The user's answers, one list of labels per question (raises on dismissal or abort)."""
    if ctx.services.ask_questions is None:
        raise ToolError("Questions cannot be asked in this context.")
    return await ctx.services.ask_questions(questions)


def _answer_text(answer: list[str] | None) -> str:
    return ", ".join(answer) if answer else "Unanswered"


async def _execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    questions: list[dict[str, Any]] = args["questions"]
    answers = await ask(ctx, questions)
    pairs = ", ".join(
        f'"{q["question"]}"="{_answer_text(answers[i] if i < len(answers) else None)}"' for i, q in enumerate(questions)
    )
    count = len(questions)
    return ToolResult(
        title=f"Asked {count} question{'s' if count > 1 else ''}",
        output=f"User has answered your questions: {pairs}. You can now continue with the user's answers in mind.",
        metadata={"answers": answers},
    )


async def _init(_: InitContext) -> ToolDefinition:
    return ToolDefinition(description("question"), QuestionParams, _execute, json_schema=_schema())


TOOL = ToolInfo(id="question", init=_init)
