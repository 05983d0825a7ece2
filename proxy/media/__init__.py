"""Audio (speech, transcription, translation) and image routes: OpenAI's format, passed through.

Each route reads the few fields routing and accounting need, sends the body on with only `model`
replaced, and measures the call in the units it is priced in (characters, seconds, images, and
tokens by modality where the provider reports them).
"""
