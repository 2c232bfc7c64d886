"""GET /v1/models: the served models as vLLM lists them (OpenAI's fields, and vLLM's
`root`, `parent`, `max_model_len` and `permission`)."""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, Field


class ModelPermission(BaseModel):
    """OpenAI's retired permission object; vLLM still sends one a model (clients that read
    `permission[0]` expect it)."""

    id: str = Field(default_factory=lambda: f"modelperm-{uuid.uuid4().hex}")
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "kvtier"
    root: str | None = None  # the model the engine loaded (its path or preset), as vLLM's
    parent: str | None = None  # a LoRA adapter's base model in vLLM; kvtier serves none
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
