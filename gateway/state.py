"""What routes need of the running app: the `Gateway`, handed over in the lifespan state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from starlette.applications import Starlette
from starlette.requests import HTTPConnection

from gateway.config.settings import Settings
from gateway.edge.feedback_limits import FeedbackLimits
from gateway.engine_path.background import Background
from gateway.engine_path.batch import BatchRunner
from gateway.engine_path.chat_models import ChatModels
from gateway.engine_path.generation import GenerationService
from gateway.engine_path.model_registry import ModelRegistry
from gateway.engine_path.reattach import Detached
from gateway.engine_path.served_model import ServedModel
from gateway.stores.feedback import FeedbackStore

if TYPE_CHECKING:  # drain -> refusals -> the routes, which import this module
    from gateway.drain import Drain


@dataclass(frozen=True)
class Gateway:
    """What every route needs, handed to it through the lifespan state."""

    settings: Settings
    chats: ChatModels  # the chat models by name (gateway/http/model_choice.py picks one)
    feedback: FeedbackStore
    feedback_limits: FeedbackLimits
    drain: Drain
    detached: Detached  # control-protocol generations waiting for their client to reattach
    background: Background  # the Responses API's background responses, and their events
    models: ModelRegistry  # every model served by name: the chat models, embedding models

    # The default chat model's path: what a protocol that names no model uses.
    @property
    def model(self) -> ServedModel:
        return self.chats.default.served

    @property
    def service(self) -> GenerationService:
        return self.chats.default.service

    @property
    def batches(self) -> BatchRunner:
        return self.chats.default.batches


def gateway_of(connection: HTTPConnection) -> Gateway:
    return cast(Gateway, connection.state.gateway)


def gateway_of_app(app: Starlette) -> Gateway:
    """The running app's gateway, for introspection outside a request (tests, metrics)."""
    return cast(Gateway, app.state.gateway)
