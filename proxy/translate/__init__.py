"""Pure translators between OpenAI's chat completions and Anthropic's Messages API.

Each module is named `<client>_<provider>` for the formats it translates between, and offers
`request`, `response`, `error` and a `StreamTranslator`: bytes in, bytes out, no I/O.
"""
