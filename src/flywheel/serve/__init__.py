"""Serving: any `Model` behind the OpenAI chat-completions API (`flywheel serve`).

`flywheel serve` puts the in-process engine (or any backend) behind the same API that vLLM offers, so one
client (`flywheel.models.openai_backend.OpenAIModel`, or any OpenAI SDK) talks to every inference pool,
and tests get a real HTTP server without new dependencies. One concept per module:

- `wire`: the OpenAI format as pure functions: request bodies parsed into `Request`s, completions made
  into responses and stream chunks, tool calls, log-probs, and errors as OpenAI error JSON (`ApiError`).
- `batcher`: `Batcher`, which owns the model and turns concurrent requests into one `generate` call per
  batch (and updates a following model's weights between batches, never during one).
- `logprobs`: the model's own ("raw") log-probs of an answer, for a request or server that asks for them
  instead of the sampling distribution's ("processed", the default: what the trainer replays).
- `http`: `ModelServer` on the standard library's HTTP server, its `ServerConfig`, and `serve_model`,
  which starts one in a background thread; streams, live or whole, are sent here.
- `auth`: the server's key (`flywheel serve --api-key`): the bearer check, the 401 a request without the
  key gets, the short `GET /health` it still gets, and the warning for a server open beyond loopback.
- `follow`: a torch model whose weights follow the trainer's store (`flywheel serve --follow STORE`),
  imported on its own (`flywheel.serve.follow`) since it loads torch.

Departures from the OpenAI API: a stream with tools offered or `n` > 1 starts only when generation has
ended (no token-by-token latency gain), and a choice's log-probs come in its last chunk; `top_logprobs`
lists are empty; `n` up to `max_n` (copies of the request in the batch, seeds offset by the copy's
index); a generation cut short by the context limit after it has produced text ends with
`finish_reason="length"`, the nearest standard value; the request's `model` field is not checked (the
server serves one model); the non-standard fields `flywheel_meta` (request, becomes `Request.meta`),
`logprobs_mode` (request: "processed" or "raw"), `policy_version`, `choices[i].token_ids` and
`prompt_token_ids` (response) are added.
"""

from flywheel.serve.batcher import Batcher
from flywheel.serve.http import ModelServer, ServerConfig, serve_model
from flywheel.serve.wire import (
    Answer,
    ApiError,
    bad_request,
    chat_response,
    check_completions,
    logprobs_json,
    models_response,
    parse_answer,
    parse_chat_request,
    served,
    settled,
    stream_chunks,
    tool_call_json,
)

__all__ = [
    "Answer",
    "ApiError",
    "Batcher",
    "ModelServer",
    "ServerConfig",
    "bad_request",
    "chat_response",
    "check_completions",
    "logprobs_json",
    "models_response",
    "parse_answer",
    "parse_chat_request",
    "serve_model",
    "served",
    "settled",
    "stream_chunks",
    "tool_call_json",
]
