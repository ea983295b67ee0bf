"""The non-standard request fields of the OpenAI chat-completions format that the client and server share.

The client (`flywheel.models.openai_backend`) writes them and `flywheel serve` (`flywheel.serve.wire`)
reads them; both import the names from here, so neither has to import the other.
"""

META_FIELD = "flywheel_meta"  # non-standard body field carrying Request.meta (episode context)
