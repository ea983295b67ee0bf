"""The non-standard request fields of the OpenAI chat-completions format that the client and server share.

The client (`flywheel.models.openai_backend`) writes them and `flywheel serve` (`flywheel.serve.wire`)
reads them; both import the names from here, so neither has to import the other.
"""

META_FIELD = "flywheel_meta"  # non-standard body field carrying Request.meta (episode context)
# non-standard body field choosing whose log-probs `"logprobs": true` returns: one of LOGPROBS_MODES
LOGPROBS_MODE_FIELD = "logprobs_mode"
# "processed": under the distribution sampled from (after temperature and top-p; 0 for a greedy token),
# what the trainer replays; "raw": under the model's own softmax, as vLLM reports by default
LOGPROBS_MODES = ("processed", "raw")
